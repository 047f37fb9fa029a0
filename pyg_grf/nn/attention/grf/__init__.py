r"""GRF-masked attention (GRF paper, Sec. 3-4): the layer (:mod:`.layer`), the per-batch plan
and its one rule (:mod:`.plan`), the engine over the mask's support (:mod:`.pairs`) and the
low-rank path (:mod:`.sparse`: the memory fallback, or the cheaper of the two)."""
from pyg_grf.nn.attention.grf.layer import GRFAttention
from pyg_grf.nn.attention.grf.plan import BackendMemoryError, GRFPlan, LayerSpec, PlanPart

__all__ = ['GRFAttention', 'GRFPlan', 'LayerSpec', 'PlanPart', 'BackendMemoryError']
