r"""GRF-masked attention (GRF paper, Sec. 3-4), one module per part:

* :mod:`~pyg_grf.nn.attention.grf.layer`: :class:`GRFAttention`, which picks its plan part and
  calls its backend;
* :mod:`~pyg_grf.nn.attention.grf.plan`: :class:`GRFPlan`, the per-batch plan (a pure build,
  then read-only);
* :mod:`~pyg_grf.nn.attention.grf.choose`: what ``backend='auto'`` picks, a pure function of
  sizes, with the memory check;
* :mod:`~pyg_grf.nn.attention.grf.sparse`, :mod:`~pyg_grf.nn.attention.grf.pairs`,
  :mod:`~pyg_grf.nn.attention.grf.dense`: one backend each (structures, memory estimate,
  kernel calls).
"""
from pyg_grf.nn.attention.grf.choose import (
                                             BackendMemoryError,
                                             PlanSizes,
                                             backend_costs,
                                             backend_memory,
                                             choose_backend,
                                             plan_sizes,
)
from pyg_grf.nn.attention.grf.layer import GRFAttention
from pyg_grf.nn.attention.grf.plan import GRFPlan, LayerSpec, PlanPart

__all__ = ['GRFAttention', 'GRFPlan', 'LayerSpec', 'PlanPart', 'BackendMemoryError',
           'PlanSizes', 'plan_sizes', 'backend_costs', 'backend_memory', 'choose_backend']
