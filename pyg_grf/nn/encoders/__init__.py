from pyg_grf.nn.encoders.graph_bridge import GraphBridge  # noqa: F401
