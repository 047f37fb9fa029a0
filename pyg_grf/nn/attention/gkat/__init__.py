r"""Graph Kernel Attention (GKAT, FTFI paper, Sec. 4.2 and App. A.5) as a small package:

* :mod:`.layer`: :class:`GKATAttention`, the layer (projections, choice, call);
* :mod:`.plan`: :class:`RWGNKPlan`, the per-batch plan (pure builder, owns its tensors);
* :mod:`.sparse`, :mod:`.pairs`, :mod:`.dense`: one backend each (structures and kernel calls);
* :mod:`.choose`: the pure cost rule of ``backend='auto'`` with every backend's estimates.
"""
from pyg_grf.nn.attention.gkat.choose import BACKENDS, choose_backend, costs
from pyg_grf.nn.attention.gkat.layer import MODES, SCORES, GKATAttention
from pyg_grf.nn.attention.gkat.plan import KernelPairs, RWGNKPlan, rwgnk_kernel

__all__ = ['GKATAttention', 'RWGNKPlan', 'KernelPairs', 'rwgnk_kernel', 'choose_backend',
           'costs', 'BACKENDS', 'MODES', 'SCORES']
