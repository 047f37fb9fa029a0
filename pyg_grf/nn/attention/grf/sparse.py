r"""The ``'sparse'`` backend of :class:`~pyg_grf.nn.GRFAttention`: low rank, never forms the
mask. With :math:`\mathbf{X}_j = \phi(\mathbf{k}_j) \otimes [\mathbf{v}_j, 1]` the masked sums
are :math:`\widehat\Phi_Q (\widehat\Phi_K^\top \mathbf{X})` (symmetric mask) or
:math:`\widehat\Phi\,\mathbf{X}` (asymmetric), contracted with :math:`\phi(\mathbf{q}_i)` (GRF
paper, Sec. 3.2, Eq. 9): two (one) CSR products over the distinct (start, visited) pairs of the
walks, :math:`O(N)` for a fixed walk budget whatever the mask's support (hub nodes). The
structures: the pairs as a :class:`~pyg_grf.ops.SparsePattern` and the pair of every walk entry
(``int64``), about 40 bytes per pair plus 8 per entry. The ``'sparse_softmax'`` mode runs here
too (:func:`softmax`, GRF paper, App. D).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from torch import Tensor

from pyg_grf.features.loads import GRFLoads
from pyg_grf.nn import functional as F
from pyg_grf.ops import SparsePattern


class PhiPairs(NamedTuple):
    r"""The distinct (start, visited) pairs of :math:`\widehat\Phi` and the entries' values."""
    loads: GRFLoads
    inv: Tensor           # [nnz] pair of every entry
    index: Tensor         # [2, P] the pairs, row-major
    pattern: SparsePattern
    group: Optional[Tensor]  # [nnz] coefficient row of every entry (folded loads)
    copies: int = 1          # disjoint copies of the graph (samples on a shared graph)

    @staticmethod
    def build(loads: GRFLoads, groups: int = 1) -> 'PhiPairs':
        N = loads.num_nodes
        index, inv = loads.pairs()
        group = None if groups == 1 else loads.index[0].long() // (N // groups)
        return PhiPairs(loads, inv, index, SparsePattern(index, (N, N), _trusted=True), group)

    def values(self, f: Tensor) -> Tensor:
        r"""``[h, P]`` values of :math:`\widehat\Phi` on the pairs for coefficients ``f``
        ``[H, L + 1]`` (``h = 1`` on folded loads, one row of ``f`` per group)."""
        v = self.loads.pair_values(f, self.inv, self.index.size(1), self.group)
        return v if self.copies == 1 else v.repeat(1, self.copies)

    def to(self, device) -> 'PhiPairs':
        loads = self.loads.to(device)
        index = self.index.to(device)
        N = loads.num_nodes
        return PhiPairs(loads, self.inv.to(device), index,
                        SparsePattern(index, (N, N), _trusted=True).repeat(self.copies),
                        None if self.group is None else self.group.to(device), self.copies)

    def repeat(self, copies: int) -> 'PhiPairs':
        r"""``copies`` disjoint copies of the graph (block-diagonal pattern, values tiled)."""
        if copies == 1:
            return self
        return self._replace(pattern=self.pattern.repeat(copies), copies=self.copies * copies)

    def nbytes(self) -> int:
        p = self.pattern
        return (self.inv.numel() * 8 + self.index.numel() * 8 + p.nnz * 24
                + (0 if self.group is None else self.group.numel() * 8))


class SparseStructures(NamedTuple):
    r"""Plan structures of the ``'sparse'`` backend: the pairs of the query-side walks and,
    with independent key-side walks, of the key side."""
    query: PhiPairs
    key: Optional[PhiPairs]

    def to(self, device) -> 'SparseStructures':
        return SparseStructures(self.query.to(device),
                                None if self.key is None else self.key.to(device))

    def repeat(self, copies: int) -> 'SparseStructures':
        return SparseStructures(self.query.repeat(copies),
                                None if self.key is None else self.key.repeat(copies))

    def nbytes(self) -> int:
        return self.query.nbytes() + (0 if self.key is None else self.key.nbytes())


def build(loads: GRFLoads, mode: str, groups: int = 1) -> SparseStructures:
    r"""The plan structures of ``loads`` (folded into ``groups`` copies, or not)."""
    key = loads.key if mode == 'symmetric' else None
    return SparseStructures(PhiPairs.build(loads, groups),
                            None if key is None else PhiPairs.build(key, groups))


def memory(num_nodes: int, num_pairs: int, heads: int, m: int, d: int,
           itemsize: int = 4) -> int:
    r"""Peak bytes of the plan structures and one layer's forward and backward: the pairs,
    and about four ``[N, H, m (d + 1)]`` tensors (the outer products, the two products and a
    gradient)."""
    return num_pairs * 48 + 6 * num_pairs * heads * itemsize \
        + 4 * num_nodes * heads * m * (d + 1) * max(itemsize, 4)


def linear_sums(st: SparseStructures, phi_q: Tensor, phi_k: Tensor, v: Tensor,
                f: Tensor, symmetric: bool) -> Tensor:
    r"""``[N, h, d + 1]``: the masked sums (numerator, then the normaliser)."""
    q = st.query
    vals = q.values(f)
    if not symmetric:
        return F.low_rank_masked_linear_attention(phi_q, phi_k, v, q.pattern, vals)
    k = q if st.key is None else st.key
    kvals = vals if st.key is None else k.values(f)
    return F.low_rank_masked_linear_attention(phi_q, phi_k, v, q.pattern, vals, k.pattern, kvals)


def softmax(st: SparseStructures, q: Tensor, k: Tensor, v: Tensor, f: Tensor,
            dropout: float, training: bool) -> Tensor:
    r"""``[N, h, C]``: softmax attention on the nonzeros of :math:`\widehat\Phi`, weighted by
    its values (the ``'sparse_softmax'`` mode)."""
    pat = st.query.pattern
    return F.pair_softmax_attention(pat, F.pair_scores(pat, q, k), v, st.query.values(f),
                                    dropout, training)
