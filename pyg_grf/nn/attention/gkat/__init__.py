r"""Graph Kernel Attention (GKAT, FTFI paper, Sec. 4.2 and App. A.5): the layer
(:mod:`.layer`), the per-batch plan (:mod:`.plan`), one module per backend (:mod:`.sparse`,
:mod:`.pairs`, :mod:`.dense`) and the pure cost rule of ``backend='auto'`` (:mod:`.choose`)."""
from pyg_grf.nn.attention.gkat.choose import BACKENDS, choose_backend, costs
from pyg_grf.nn.attention.gkat.layer import MODES, SCORES, GKATAttention
from pyg_grf.nn.attention.gkat.plan import KernelPairs, RWGNKPlan, rwgnk_kernel

__all__ = ['GKATAttention', 'RWGNKPlan', 'KernelPairs', 'rwgnk_kernel', 'choose_backend',
           'costs', 'BACKENDS', 'MODES', 'SCORES']
