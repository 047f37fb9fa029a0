from pyg_grf.nn.models.samsa import SAMSABlock, SAMSAModel  # noqa: F401
