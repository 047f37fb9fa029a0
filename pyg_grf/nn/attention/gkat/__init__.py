r"""Graph Kernel Attention (GKAT, FTFI paper, Sec. 4.2 and App. A.5): the layer (:mod:`.layer`,
its linear mode on the GRF engine, its softmax mode message passing over the kernel pairs) and
the per-batch plan (:mod:`.plan`)."""
from pyg_grf.nn.attention.gkat.layer import BACKENDS, MODES, SCORES, GKATAttention
from pyg_grf.nn.attention.gkat.plan import KernelPairs, RWGNKPlan, rwgnk_kernel

__all__ = ['GKATAttention', 'RWGNKPlan', 'KernelPairs', 'rwgnk_kernel', 'BACKENDS', 'MODES',
           'SCORES']
