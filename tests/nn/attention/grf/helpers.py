r"""Inputs and independent dense O(N^2) references shared by the GRF attention tests (and by
tests/test_loader.py, tests/nn/attention/test_contract.py)."""
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.masks import GRFMask
from pyg_grf.nn import GRFAttention
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.utils import dense_masked_linear_attention, er_graph, grid_graph, path_graph

D = torch.float64

MODES = ['symmetric', 'asymmetric', 'sparse_softmax']

BACKENDS = ['sparse', 'pairs', 'auto']


def make_batch(channels=8, seed=0, key=False):
    torch.manual_seed(seed)
    t = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=seed)
    tk = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=seed + 100,
                                attr_prefix='grf_key')
    graphs = [Data(x=torch.randn(n, channels, dtype=D), edge_index=ei)
              for n, ei in [(9, grid_graph(3, 3)), (5, path_graph(5)),
                            (11, er_graph(11, 0.3, seed=2)), (1, torch.empty(2, 0).long())]]
    graphs = [t(g) for g in graphs]
    if key:
        graphs = [tk(g) for g in graphs]
    return Batch.from_data_list(graphs)


def dense_phi(index, length, load, f, N):
    keep = length < f.numel()  # hops beyond f's coefficients contribute nothing
    return torch.zeros(N, N, dtype=D).index_put(
        (index[0, keep].long(), index[1, keep].long()), f[length[keep].long()] * load[keep].to(D),
        accumulate=True)


def dense_reference(layer, b, key=False):
    """O(N^2) GRF attention from the layer's weights, every mask formed explicitly."""
    key_loads = (b.grf_key_index, b.grf_key_length, b.grf_key_load) if key else None
    return dense_grf_attention(layer, b.x, b.grf_index, b.grf_length, b.grf_load,
                               key_loads=key_loads)


def layer_mask(layer, loads):
    r"""The :class:`GRFMask` of ``layer``'s current coefficients on ``loads`` (one walk draw)."""
    return GRFMask.from_loads(loads, f=layer.coefficients(), asymmetric=layer.mode != 'symmetric')


def make_layer(mode, backend, seed=0):
    torch.manual_seed(seed)
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode, eps=0.0, feature_map='elu',
                         backend=backend).double()
    with torch.no_grad():
        layer.f.copy_(torch.rand(2, 4) + 0.1)
    return layer


def batch_of_three(channels=8, seed=0):
    torch.manual_seed(seed)
    t = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=seed)
    graphs = [Data(x=torch.randn(n, channels, dtype=D), edge_index=ei)
              for n, ei in [(9, grid_graph(3, 3)), (5, path_graph(5)),
                            (11, er_graph(11, 0.3, seed=2))]]
    return Batch.from_data_list([t(g) for g in graphs])


def dense_grf_attention(layer, x, index, length, load, key_scale=None, key_loads=None):
    """Independent O(N^2) re-implementation of GRFAttention from its weights; ``key_scale``
    ``[N, H]`` multiplies the coefficients of each key column in the numerator only (the
    linear modes' dropout); ``key_loads`` ``(index, length, load)``: the key side's walks of a
    symmetric mask (default: the query side's)."""
    N, H, C = x.size(0), layer.heads, layer.head_channels
    q, k, v = (x @ layer.to_qkv.weight.T + layer.to_qkv.bias).view(N, 3, H, C).unbind(1)
    outs = []
    for h in range(H):
        f = layer.f[h]
        phi = dense_phi(index, length, load, f, N)
        if layer.mode == 'sparse_softmax':
            s = torch.exp(q[:, h] @ k[:, h].T / C ** 0.5) * phi
        else:
            phik = phi if key_loads is None else dense_phi(*key_loads, f, N)
            M = phi @ phik.T if layer.mode == 'symmetric' else phi
            fq, fk = layer.feature_map(q[:, h]), layer.feature_map(k[:, h])
            s = (fq @ fk.T) * M
        num = s if key_scale is None else s * key_scale[:, h].unsqueeze(0)
        outs.append(num @ v[:, h] / s.sum(1, keepdim=True))
    out = torch.cat(outs, dim=1)
    return out @ layer.to_out.weight.T + layer.to_out.bias


def batch_with_draws(num_draws, sizes=(7, 12, 9), seed=0, key=False):
    t = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=seed, num_draws=num_draws)
    tk = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=seed + 1, num_draws=num_draws,
                                attr_prefix='grf_key')
    graphs = []
    for i, n in enumerate(sizes):
        g = t(Data(edge_index=er_graph(n, 0.4, i), num_nodes=n, x=torch.randn(n, 8)))
        graphs.append(tk(g) if key else g)
    return Batch.from_data_list(graphs)


def draws_reference(layer, x, grf, batch):
    # head h: its own draw's mask, dense, with coefficients layer.coefficients()[h]
    q, k, v = layer.project(x)
    f = layer.coefficients()
    if layer.mode != 'sparse_softmax':
        pq, pk = layer.features(q, k, batch)
    outs = []
    for h, d in enumerate(layer.draws(grf.num_draws)):
        sub = grf.fold((d,))
        M = GRFMask.from_loads(sub, f=f[h], asymmetric=layer.mode != 'symmetric').to_dense()
        if layer.mode == 'sparse_softmax':
            s = (q[:, h] @ k[:, h].t()) * layer.head_channels ** -0.5
            s = s.masked_fill(M == 0, float('-inf'))
            e = torch.exp(s - s.amax(-1, keepdim=True)) * M
            outs.append((e / e.sum(-1, keepdim=True)) @ v[:, h])
        else:
            outs.append(dense_masked_linear_attention(pq[:, h:h + 1], pk[:, h:h + 1],
                                                      v[:, h:h + 1], M)[:, 0])
    return layer.to_out(torch.stack(outs, 1).reshape(x.size(0), -1))
