r"""Model specs and the allow-lists of the classes a spec or a ``pyg-grf`` config may name.

A checkpoint names the classes to build in its hyperparameters, a config names the task, the
data module, transforms, callbacks, ...: building an arbitrary ``class_path`` would let either
run any code (``os.system``, or ``torch_geometric.nn.Sequential``, which evaluates strings). So
every ``class_path`` is checked against :data:`MODEL_CLASS_PATHS` (specs, checkpoints) and
:data:`CONFIG_CLASS_PATHS` (configs), plus the classes registered with
:func:`register_model_class` / :func:`register_config_class`, *before* anything is imported;
:class:`UntrustedClassError` is raised otherwise.
"""
from __future__ import annotations

import functools
import importlib
import sys
import types
from typing import Any, Dict, Iterable, Sequence, Tuple, Union

import torch

#: The classes a model spec (``class_path``) may name, in a config's model or a checkpoint's
#: hyperparameters: an explicit list, not whole packages (``torch_geometric.nn.Sequential``
#: evaluates strings); their defining-module names are accepted too. Add your own with
#: :func:`register_model_class`.
MODEL_CLASS_PATHS = (
    # pyg_grf models, blocks and layers
    'pyg_grf.nn.GraphTransformer', 'pyg_grf.nn.GRFNodeModel',
    'pyg_grf.nn.models.samsa.SAMSAModel', 'pyg_grf.nn.GRFGPSConv',
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

#: The other classes a ``pyg-grf`` config or command line may name (besides
#: :data:`MODEL_CLASS_PATHS`), by kind: an explicit list again. Add your own with
#: :func:`register_config_class`.
CONFIG_CLASS_PATHS: Dict[str, Sequence[str]] = {
    'data module': (
        'pyg_grf.lightning.datamodules.SyntheticDataModule',
        'pyg_grf.lightning.datamodules.TUDataModule',
        'pyg_grf.lightning.datamodules.LRGBDataModule',
        'pyg_grf.lightning.datamodules.PlanetoidDataModule',
        'pyg_grf.lightning.datamodules.HeterophilousDataModule',
    ),
    'transform': (
        'pyg_grf.transforms.AddGraphRandomFeatures', 'pyg_grf.transforms.AddRWGNKFeatures',
        'pyg_grf.transforms.AddGraphBridgeTokens', 'pyg_grf.transforms.RestrictGraphRandomFeatures',
        'torch_geometric.transforms.NormalizeFeatures', 'torch_geometric.transforms.ToUndirected',
        'torch_geometric.transforms.AddSelfLoops', 'torch_geometric.transforms.AddRandomWalkPE',
        'torch_geometric.transforms.AddLaplacianEigenvectorPE',
        'torch_geometric.transforms.OneHotDegree', 'torch_geometric.transforms.Constant',
    ),
    'callback': (
        'pyg_grf.lightning.callbacks.AtomicModelCheckpoint',
        'pyg_grf.lightning.callbacks.EpochMetricsLog',
        'pyg_grf.lightning.callbacks.LearningCurvePlot', 'pyg_grf.lightning.callbacks.MallocTrim',
        'lightning.pytorch.callbacks.ModelCheckpoint', 'lightning.pytorch.callbacks.EarlyStopping',
        'lightning.pytorch.callbacks.LearningRateMonitor',
        'lightning.pytorch.callbacks.ModelSummary', 'lightning.pytorch.callbacks.RichModelSummary',
        'lightning.pytorch.callbacks.TQDMProgressBar',
        'lightning.pytorch.callbacks.RichProgressBar', 'lightning.pytorch.callbacks.Timer',
        'lightning.pytorch.callbacks.DeviceStatsMonitor',
        'lightning.pytorch.callbacks.StochasticWeightAveraging',
        'lightning.pytorch.callbacks.GradientAccumulationScheduler',
    ),
    'logger': (
        'lightning.pytorch.loggers.CSVLogger', 'lightning.pytorch.loggers.TensorBoardLogger',
    ),
    'trainer plugin': (
        'lightning.pytorch.strategies.DDPStrategy',
        'lightning.pytorch.strategies.SingleDeviceStrategy',
        'lightning.pytorch.profilers.SimpleProfiler',
        'lightning.pytorch.profilers.AdvancedProfiler',
    ),
    'optimizer': (
        'torch.optim.Adam', 'torch.optim.AdamW', 'torch.optim.SGD', 'torch.optim.RMSprop',
        'torch.optim.Adagrad', 'torch.optim.Adamax', 'torch.optim.NAdam', 'torch.optim.RAdam',
    ),
    'learning-rate scheduler': (
        'torch.optim.lr_scheduler.StepLR', 'torch.optim.lr_scheduler.MultiStepLR',
        'torch.optim.lr_scheduler.ExponentialLR', 'torch.optim.lr_scheduler.CosineAnnealingLR',
        'torch.optim.lr_scheduler.CosineAnnealingWarmRestarts',
        'torch.optim.lr_scheduler.OneCycleLR', 'torch.optim.lr_scheduler.LinearLR',
        'torch.optim.lr_scheduler.ConstantLR', 'torch.optim.lr_scheduler.PolynomialLR',
        'lightning.pytorch.cli.ReduceLROnPlateau',
    ),
}

_REGISTERED: Dict[str, type] = {}
_REGISTERED_CONFIG: Dict[str, type] = {}


def register_model_class(cls: type) -> type:
    r"""Allows a :class:`torch.nn.Module` subclass of your own in model specs (configs and
    checkpoint hyperparameters), under ``f'{cls.__module__}.{cls.__qualname__}'``. Usable as a
    class decorator. Register only code you trust: a checkpoint may name any registered class."""
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise TypeError(f"register_model_class needs a torch.nn.Module subclass, got {cls!r}")
    _REGISTERED[f'{cls.__module__}.{cls.__qualname__}'] = cls
    return cls


def register_config_class(cls: type) -> type:
    r"""Allows a class of your own (a data module, a transform, a callback, ...) in ``pyg-grf``
    configs and command lines, under its defining-module name and the packages that re-export
    it. Usable as a class decorator; call it before the CLI parses its arguments (e.g. in a
    script that then calls :func:`pyg_grf.lightning.cli.main`). Register only code you trust.
    Models go through :func:`register_model_class`, which also allows them in checkpoints."""
    if not isinstance(cls, type):
        raise TypeError(f"register_config_class needs a class, got {cls!r}")
    _REGISTERED_CONFIG[f'{cls.__module__}.{cls.__qualname__}'] = cls
    return cls


def is_dotted_name(path: Any) -> bool:
    r"""Whether :obj:`path` is a string of dot-separated Python identifiers."""
    return isinstance(path, str) and all(part.isidentifier() for part in path.split('.'))


def _names(cls: type) -> Dict[str, str]:
    # The defining-module name of a class and the names under which the packages above that
    # module re-export it (`pyg_grf.nn.GraphTransformer`), each mapped to the first.
    canonical = f'{cls.__module__}.{cls.__qualname__}'
    names = {canonical: canonical}
    parts = cls.__module__.split('.')
    for end in range(1, len(parts)):
        package = sys.modules.get('.'.join(parts[:end]))  # already imported: a lookup only
        if package is not None and getattr(package, cls.__name__, None) is cls:
            names[f"{'.'.join(parts[:end])}.{cls.__name__}"] = canonical
    return names


@functools.lru_cache(maxsize=None)
def _resolve(paths: Tuple[str, ...]) -> Dict[str, str]:
    allowed: Dict[str, str] = {}
    for path in paths:
        module, name = path.rsplit('.', 1)
        try:  # trusted packages only: importing them runs no foreign code
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # e.g. ogb not installed
            continue
        allowed.update(_names(cls))
        allowed[path] = f'{cls.__module__}.{cls.__qualname__}'
    return allowed


def allowed_class_paths() -> Dict[str, str]:
    r"""Every class path a model spec may name (:data:`MODEL_CLASS_PATHS`, their defining-module
    names and re-exports, and :func:`register_model_class`'s), mapped to the canonical one."""
    return {**_resolve(MODEL_CLASS_PATHS), **{path: path for path in _REGISTERED}}


def allowed_config_class_paths() -> Dict[str, str]:
    r"""Every class path a ``pyg-grf`` config or command line may name: those of
    :func:`allowed_class_paths`, of :data:`CONFIG_CLASS_PATHS` and of
    :func:`register_config_class` (with their defining-module names and re-exports), mapped to
    the canonical one."""
    config = _resolve(tuple(path for paths in CONFIG_CLASS_PATHS.values() for path in paths))
    registered: Dict[str, str] = {}
    for cls in [*_REGISTERED.values(), *_REGISTERED_CONFIG.values()]:
        registered.update(_names(cls))
    return {**allowed_class_paths(), **config, **registered}


class UntrustedClassError(ValueError):
    r"""Raised when a model spec (from a config or a checkpoint) names a class that is not in
    :data:`MODEL_CLASS_PATHS` (nor registered with :func:`register_model_class`) or something
    that is not a :class:`torch.nn.Module` subclass, and when a ``pyg-grf`` config names a
    class outside :func:`allowed_config_class_paths` (:func:`check_config_class_paths`)."""


def check_class_path(class_path: Any, where: str = 'model') -> str:
    r"""Refuses a ``class_path`` that is not an allowed class *before* importing anything
    (raises :class:`UntrustedClassError`, naming the spec :obj:`where`); returns it otherwise."""
    if not is_dotted_name(class_path) or '.' not in class_path:
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


def _trusted_by_prefix(path: str, trusted: Iterable[str]) -> bool:
    return any(path == entry or path.startswith(entry + '.') for entry in trusted)


def check_config_class_paths(config: Any, where: str = '',
                             trusted: Iterable[str] = ()) -> None:
    r"""Walks a parsed ``pyg-grf`` config (nested dicts and lists, as
    ``jsonargparse.Namespace.as_dict()`` gives) *before* anything is instantiated and raises
    :class:`UntrustedClassError` for every ``class_path`` (or ``_class_path``) outside
    :func:`allowed_config_class_paths`, and for every class, function or module a dotted name
    was resolved to (a ``Callable`` argument) unless it is an allowed class. :obj:`trusted`
    holds extra dotted names, each trusting itself and everything under it. :obj:`where` is
    the key of :obj:`config` in the errors."""
    allowed = allowed_config_class_paths()
    trusted = tuple(trusted)

    def refuse(key: str, path: str, what: str) -> UntrustedClassError:
        name = path.rsplit('.', 1)[-1]
        same = sorted(p for p in allowed if p.rsplit('.', 1)[-1] == name)
        hint = f" (allowed under this name: {', '.join(same)})" if same else ''
        return UntrustedClassError(
            f"Refusing to build '{key}' from {what} {path!r}: a pyg-grf config or command line "
            f"may only name the classes listed in pyg_grf.lightning.specs.MODEL_CLASS_PATHS "
            f"and CONFIG_CLASS_PATHS{hint}, since building another class "
            f"can run any code (torch_geometric.nn.Sequential evaluates strings). To use a "
            f"class of your own, register it before the CLI parses (register_model_class for "
            f"models, register_config_class for data modules, transforms, callbacks, ...), or "
            f"name it, or its package, in $PYG_GRF_TRUSTED_CLASSES "
            f"(e.g. PYG_GRF_TRUSTED_CLASSES=mypackage.MyDataModule pyg-grf fit ...).")

    def ok(path: str) -> bool:
        return path in allowed or _trusted_by_prefix(path, trusted)

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for name in ('class_path', '_class_path'):
                if name not in value:
                    continue
                path, field = value[name], f'{key}.{name}' if key else name
                if not is_dotted_name(path) or '.' not in path:
                    raise UntrustedClassError(
                        f"'{field}' must be a dotted class name such as "
                        f"'pyg_grf.lightning.tasks.GraphLevelTask' (got {path!r})")
                if not ok(path):
                    raise refuse(key or 'config', path, 'class_path')
            for name, item in value.items():
                walk(item, f'{key}.{name}' if key else str(name))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f'{key}[{i}]')
        elif isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType,
                                types.MethodType, types.ModuleType, functools.partial)):
            target = value.func if isinstance(value, functools.partial) else value
            path = (target.__name__ if isinstance(target, types.ModuleType) else
                    f"{getattr(target, '__module__', None)}."
                    f"{getattr(target, '__qualname__', None)}")
            if not (isinstance(target, type) and ok(path)) and not _trusted_by_prefix(
                    path, trusted):
                raise refuse(key or 'config', path, 'the Python object')

    walk(config, where)


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


__all__ = ['CONFIG_CLASS_PATHS', 'MODEL_CLASS_PATHS', 'UntrustedClassError', 'allowed_class_paths',
           'allowed_config_class_paths', 'build_model', 'build_spec', 'check_class_path',
           'check_config_class_paths', 'check_hparams_class_paths', 'register_config_class',
           'register_model_class', 'resolve_model_class']
