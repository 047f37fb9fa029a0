r"""Model specs: building a task's model from a ``{'class_path': ..., 'init_args': ...}`` spec
(a config's model, or a checkpoint's hyperparameters), and the allow-list of the classes such a
spec may name.

A checkpoint names the classes to build in its hyperparameters; building an arbitrary
``class_path`` would let a checkpoint run any code (``os.system``, or
``torch_geometric.nn.Sequential``, which evaluates strings). So every ``class_path`` is checked
against :data:`MODEL_CLASS_PATHS` (and the classes added with :func:`register_model_class`)
*before* anything is imported, and :class:`UntrustedClassError` is raised otherwise.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Optional, Union

import torch

#: The classes a model spec (``class_path``) may name, in a config's model or a checkpoint's
#: hyperparameters, by their public dotted names: an explicit list, not whole packages (a
#: package-wide rule admitted e.g. ``torch_geometric.nn.Sequential``, which evaluates strings).
#: Their defining-module names (``torch_geometric.nn.conv.gat_conv.GATConv``) are accepted too.
#: Anything else is refused before it is imported; add your own with
#: :func:`register_model_class`.
MODEL_CLASS_PATHS = (
    # pyg_grf models, blocks and layers
    'pyg_grf.nn.GraphTransformer', 'pyg_grf.nn.models.samsa.SAMSAModel', 'pyg_grf.nn.GRFGPSConv',
    'pyg_grf.nn.GRFAttention', 'pyg_grf.nn.GKATAttention', 'pyg_grf.nn.SAMSAAttention',
    'pyg_grf.nn.MaskedLinearAttention', 'pyg_grf.nn.GraphBridge',
    'pyg_grf.nn.attention.reference.LinearAttention',
    'pyg_grf.nn.attention.reference.SoftmaxAttention',
    'pyg_grf.nn.attention.reference.PowerSeriesAttention',
    'pyg_grf.masks.grid.GridRPE',
    # the tasks themselves (a checkpoint's hyperparameters name their own class)
    'pyg_grf.lightning.tasks.GraphLevelTask', 'pyg_grf.lightning.tasks.NodeLevelTask',
    'pyg_grf.lightning.link.LinkLevelTask',
    # PyG message passing layers a user puts beside the attention (conv)
    'torch_geometric.nn.GATConv', 'torch_geometric.nn.GATv2Conv', 'torch_geometric.nn.GINConv',
    'torch_geometric.nn.GINEConv', 'torch_geometric.nn.GCNConv', 'torch_geometric.nn.SAGEConv',
    'torch_geometric.nn.GraphConv', 'torch_geometric.nn.TransformerConv',
    'torch_geometric.nn.ResGatedGraphConv', 'torch_geometric.nn.GENConv',
    'torch_geometric.nn.MLP',
    # torch building blocks of those (nn in GINConv, ...)
    'torch.nn.Linear', 'torch.nn.Sequential', 'torch.nn.Identity', 'torch.nn.Dropout',
    'torch.nn.ReLU', 'torch.nn.GELU', 'torch.nn.ELU', 'torch.nn.LeakyReLU', 'torch.nn.SiLU',
    'torch.nn.Tanh', 'torch.nn.Sigmoid', 'torch.nn.LayerNorm', 'torch.nn.BatchNorm1d',
    # OGB's molecule encoders (Peptides configs)
    'ogb.graphproppred.mol_encoder.AtomEncoder', 'ogb.graphproppred.mol_encoder.BondEncoder',
)

_REGISTERED: Dict[str, type] = {}
_ALLOWED: Optional[Dict[str, str]] = None


def register_model_class(cls: type) -> type:
    r"""Allows a :class:`torch.nn.Module` subclass of your own in model specs (configs and
    checkpoint hyperparameters), under ``f'{cls.__module__}.{cls.__qualname__}'``. Usable as a
    class decorator. Register only code you trust: a checkpoint may name any registered class."""
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise TypeError(f"register_model_class needs a torch.nn.Module subclass, got {cls!r}")
    _REGISTERED[f'{cls.__module__}.{cls.__qualname__}'] = cls
    return cls


def allowed_class_paths() -> Dict[str, str]:
    r"""Every class path a model spec may name (:data:`MODEL_CLASS_PATHS`, their defining-module
    names, and :func:`register_model_class`'s), mapped to the canonical one."""
    global _ALLOWED
    if _ALLOWED is None:
        allowed = {}
        for path in MODEL_CLASS_PATHS:
            module, name = path.rsplit('.', 1)
            try:  # trusted packages only: importing them runs no foreign code
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):  # e.g. ogb not installed
                continue
            canonical = f'{cls.__module__}.{cls.__qualname__}'
            allowed[path] = allowed[canonical] = canonical
        _ALLOWED = allowed
    return {**_ALLOWED, **{path: path for path in _REGISTERED}}


class UntrustedClassError(ValueError):
    r"""Raised when a model spec (from a config or a checkpoint) names a class that is not in
    :data:`MODEL_CLASS_PATHS` (nor registered with :func:`register_model_class`) or something
    that is not a :class:`torch.nn.Module` subclass."""


def check_class_path(class_path: Any, where: str = 'model') -> str:
    r"""Refuses a ``class_path`` that is not an allowed class *before* importing anything
    (raises :class:`UntrustedClassError`); returns it otherwise. :obj:`where` names the spec in
    the error (``'model.init_args.conv'``)."""
    if not isinstance(class_path, str) or not all(
            part.isidentifier() for part in class_path.split('.')) or '.' not in class_path:
        raise UntrustedClassError(f"'{where}.class_path' must be a dotted name such as "
                                  f"'pyg_grf.nn.models.GraphTransformer' (got {class_path!r})")
    if class_path not in allowed_class_paths():
        raise UntrustedClassError(
            f"Refusing to build '{where}' from class_path {class_path!r}: only the "
            f"torch.nn.Module subclasses listed in pyg_grf.lightning.specs.MODEL_CLASS_PATHS "
            f"(or registered with register_model_class) may be named in a config or checkpoint "
            f"(a checkpoint that names other code could run it). Register your class, or build "
            f"the model yourself and pass it: GraphLevelTask.load_from_checkpoint(path, "
            f"model=my_model).")
    return class_path


def resolve_model_class(class_path: str, where: str = 'model') -> type:
    r"""The :class:`torch.nn.Module` subclass an allowed ``class_path`` names, imported after
    :func:`check_class_path`; :class:`UntrustedClassError` if it is not importable or not a
    module class."""
    check_class_path(class_path, where)
    if class_path in _REGISTERED:
        return _REGISTERED[class_path]
    module, name = class_path.rsplit('.', 1)
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UntrustedClassError(f"'{where}.class_path' {class_path!r} does not name an "
                                  f"importable class ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise UntrustedClassError(f"'{where}.class_path' {class_path!r} is not a "
                                  f"torch.nn.Module subclass (got {cls!r})")
    return cls


def check_hparams_class_paths(hparams: Any, where: str = 'hparams') -> None:
    r"""Walks a (checkpoint's) hyperparameters and refuses every ``class_path`` /
    ``_class_path`` outside :data:`MODEL_CLASS_PATHS` (the task class itself may come from
    :obj:`pyg_grf` only)."""
    if isinstance(hparams, dict):
        for key, value in hparams.items():
            if key in ('class_path', '_class_path'):
                check_class_path(value, where)
            else:
                check_hparams_class_paths(value, f'{where}.{key}')
    elif isinstance(hparams, (list, tuple)):
        for i, value in enumerate(hparams):
            check_hparams_class_paths(value, f'{where}[{i}]')


def build_spec(spec: Dict[str, Any], where: str = 'model') -> torch.nn.Module:
    r"""Builds a jsonargparse-style ``{'class_path', 'init_args'}`` spec whose ``init_args`` may
    hold nested module specs (e.g. :class:`~pyg_grf.nn.models.GraphTransformer`'s ``conv``),
    inside out, every class checked against :data:`MODEL_CLASS_PATHS` before anything is
    imported."""
    check_hparams_class_paths(spec, where)
    cls = resolve_model_class(spec['class_path'], where)
    init_args = spec.get('init_args', {}) or {}
    if not isinstance(init_args, dict):
        raise UntrustedClassError(f"'{where}.init_args' must be a dict (got "
                                  f"{type(init_args).__name__})")
    init_args = {key: build_spec(value, f'{where}.init_args.{key}')
                 if isinstance(value, dict) and 'class_path' in value else value
                 for key, value in init_args.items()}
    return cls(**init_args)


def build_model(model: Union[torch.nn.Module, Dict[str, Any]]) -> torch.nn.Module:
    r"""A task's model: a :class:`torch.nn.Module` as it is, a ``class_path`` spec through
    :func:`build_spec`, or a dict of
    :class:`~pyg_grf.nn.models.graph_transformer.GraphTransformer` arguments."""
    if isinstance(model, torch.nn.Module):
        return model
    if isinstance(model, dict):
        model = dict(model)
        if 'class_path' in model:  # a jsonargparse-style spec
            return build_spec(model, 'model')
        from pyg_grf.nn.models.graph_transformer import GraphTransformer
        return GraphTransformer(**model)
    raise TypeError(f"'model' must be a torch.nn.Module or a dict of GraphTransformer arguments, "
                    f"got {type(model).__name__}")


__all__ = [
    'MODEL_CLASS_PATHS',
    'UntrustedClassError',
    'allowed_class_paths',
    'build_model',
    'build_spec',
    'check_class_path',
    'check_hparams_class_paths',
    'register_model_class',
    'resolve_model_class',
]
