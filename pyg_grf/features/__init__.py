r"""Graph features from random walks, and their exact dense references."""
from pyg_grf.features.exact import dense_adjacency, power_series_kernel
from pyg_grf.features.grf import (
                                  DirectedGraphWarning,
                                  deconvolve,
                                  graph_random_features,
                                  grf_constant,
                                  grf_loads,
                                  grf_tail_bound,
                                  normalized_adjacency,
                                  required_walks,
                                  self_convolution,
                                  sparsity_bound,
)
from pyg_grf.features.loads import GRFLoads
from pyg_grf.features.rwgnk import rwgnk_expected_features, rwgnk_features, rwgnk_kernel

__all__ = ['GRFLoads', 'normalized_adjacency', 'DirectedGraphWarning', 'grf_loads',
           'graph_random_features', 'deconvolve', 'self_convolution', 'power_series_kernel',
           'dense_adjacency', 'required_walks', 'grf_constant', 'grf_tail_bound',
           'sparsity_bound', 'rwgnk_features', 'rwgnk_expected_features', 'rwgnk_kernel']
