r"""GRF-masked attention (GRF paper, Sec. 3-4): the layer (:mod:`.layer`), the per-batch plan
(:mod:`.plan`), the pure cost rule of ``backend='auto'`` (:mod:`.choose`) and one module per
backend (:mod:`.sparse`, :mod:`.pairs`, :mod:`.dense`)."""
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
