from pyg_grf.nn.models.link_decoder import LinkDecoder  # noqa: F401
from pyg_grf.nn.models.node import GRFNodeModel  # noqa: F401
from pyg_grf.nn.models.samsa import SAMSABlock, SAMSAModel  # noqa: F401
