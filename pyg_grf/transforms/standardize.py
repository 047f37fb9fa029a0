r"""Per-column standardisation of graph attributes with statistics of the training graphs."""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform


class Standardize(BaseTransform):
    r"""Maps every column of the attributes :obj:`attrs` (e.g. node features ``x`` and node
    targets ``y`` of a regression) to :math:`(v - \mu) / \sigma`, with the mean :math:`\mu`
    and standard deviation :math:`\sigma` of that column over the rows of the *training* graphs
    (:meth:`fit`), so that validation and test data are scaled by training statistics only.
    Predictions of a model trained on standardised targets map back with :meth:`inverse`.

    :class:`~pyg_grf.lightning.datamodules.GraphDataModule` fits one on its training split
    (``standardize=[...]``); the statistics are plain lists, so a config can also give them.

    Args:
        attrs (list of str): the attributes, each ``[rows, columns]`` (or ``[rows]``) and
            stacked along rows by PyG's collation (default: :obj:`('x',)`).
        mean (dict, optional): ``{attr: [per-column mean]}`` (default: :obj:`None`, from
            :meth:`fit`).
        std (dict, optional): ``{attr: [per-column std]}``; columns with a spread below
            :obj:`eps` are divided by :obj:`eps` instead (default: :obj:`None`).
        eps (float, optional): the smallest :math:`\sigma` (default: :obj:`1e-6`).
    """

    def __init__(self, attrs: Sequence[str] = ('x', ), mean: Optional[Dict[str, List]] = None,
                 std: Optional[Dict[str, List]] = None, eps: float = 1e-6):
        if isinstance(attrs, str) or not attrs:
            raise ValueError(f"'attrs' must be a non-empty list of attribute names, got "
                             f"{attrs!r}")
        if (mean is None) != (std is None):
            raise ValueError("give both 'mean' and 'std', or neither (then call fit())")
        self.attrs = list(attrs)
        self.eps = float(eps)
        self.mean = self.std = None
        if mean is not None:
            missing = [a for a in self.attrs if a not in mean or a not in std]
            if missing:
                raise ValueError(f"'mean' and 'std' need an entry for every attribute of "
                                 f"{self.attrs}; missing: {missing}")
            self.mean = {a: torch.as_tensor(mean[a], dtype=torch.float) for a in self.attrs}
            self.std = {a: torch.as_tensor(std[a], dtype=torch.float).clamp_min(self.eps)
                        for a in self.attrs}
            bad = [a for a in self.attrs if not (torch.isfinite(self.mean[a]).all()
                                                 and torch.isfinite(self.std[a]).all())]
            if bad:
                raise ValueError(f"'mean' and 'std' must be finite numbers, got NaN or inf for "
                                 f"{bad}")

    def fit(self, graphs: Iterable[Data]) -> 'Standardize':
        r"""Fits the statistics on :obj:`graphs` (a dataset or any iterable of ``Data``; a
        PyG dataset is read without its own ``transform``). Returns itself."""
        if hasattr(graphs, 'get') and hasattr(graphs, 'indices'):  # raw graphs of a PyG dataset
            graphs = [graphs.get(i) for i in graphs.indices()]
        rows: Dict[str, List[Tensor]] = {a: [] for a in self.attrs}
        for data in graphs:
            for a in self.attrs:
                rows[a].append(self._value(data, a).double())
        if not rows[self.attrs[0]]:
            raise ValueError("Standardize.fit() needs at least one graph")
        cat = {a: torch.cat(v) for a, v in rows.items()}
        for a, v in cat.items():  # one NaN or inf would turn its whole column into NaN
            bad = ~torch.isfinite(v)
            if bad.any():
                cols = bad.reshape(v.size(0), -1).any(0).nonzero().view(-1).tolist()
                raise ValueError(f"Standardize.fit() needs finite values, but {int(bad.sum())} "
                                 f"of the {v.numel()} values of {a!r} are NaN or inf (column(s) "
                                 f"{cols[:10]}{' ...' if len(cols) > 10 else ''}); clean or "
                                 f"drop those graphs first")
        short = [a for a, v in cat.items() if v.size(0) < 2]
        if short:
            raise ValueError(f"Standardize.fit() needs at least two rows of {short} to estimate "
                             f"a spread")
        self.mean = {a: v.mean(0).float() for a, v in cat.items()}
        self.std = {a: v.std(0).float().clamp_min(self.eps) for a, v in cat.items()}
        return self

    def _value(self, data: Data, attr: str) -> Tensor:
        value = getattr(data, attr, None)
        if not (isinstance(value, Tensor) and value.is_floating_point()):
            got = value.dtype if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"Standardize needs a floating-point tensor data.{attr}, got {got}")
        return value

    def _check_fitted(self):
        if self.mean is None:
            raise RuntimeError("Standardize has no statistics: call fit(train_graphs) first or "
                               "give 'mean' and 'std'")

    def forward(self, data: Data) -> Data:
        self._check_fitted()
        for a in self.attrs:
            value = self._value(data, a)
            data[a] = (value - self.mean[a].to(value)) / self.std[a].to(value)
        return data

    def inverse(self, value: Tensor, attr: str = 'y') -> Tensor:
        r"""Maps standardised values of :obj:`attr` (e.g. a model's predictions of ``y``) back
        to the original units."""
        self._check_fitted()
        if attr not in self.mean:
            raise ValueError(f"no statistics for {attr!r}; fitted: {self.attrs}")
        return value * self.std[attr].to(value) + self.mean[attr].to(value)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(attrs={self.attrs}, fitted={self.mean is not None})'
