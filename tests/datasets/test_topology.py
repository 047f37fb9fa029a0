"""The topology check: a node task whose label needs the 2-hop neighbourhood. GRF attention must
beat unmasked linear attention by a wide margin, and the GRF-GPS layer must match GIN."""
import pytest
import torch
from torch_geometric.data import Batch
from torch_geometric.nn import GINConv

from pyg_grf.datasets import TwoHopMajorityDataset
from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFAttention, GRFGPSConv, LinearAttention
from pyg_grf.transforms import AddGraphRandomFeatures

H = 32


def mlp(i, o):
    return torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))


class Net(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.lin_in = torch.nn.Linear(2, H)
        if kind == 'linear':
            self.layers = torch.nn.ModuleList([LinearAttention(H, heads=4) for _ in range(2)])
        elif kind == 'grf':
            self.layers = torch.nn.ModuleList([GRFAttention(H, heads=4, max_length=1,
                                                            feature_map='elu')
                                               for _ in range(2)])
        elif kind == 'gin':  # residual + layer norm, as the GPS layer has
            self.layers = torch.nn.ModuleList([GINConv(mlp(H, H)) for _ in range(2)])
            self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(H) for _ in range(2)])
        else:  # GRF-GPS
            self.layers = torch.nn.ModuleList([
                GRFGPSConv(H, GINConv(mlp(H, H)), heads=4, norm='layer_norm',
                           attn_kwargs={'max_length': 1, 'feature_map': 'elu'})
                for _ in range(2)])
        self.head = mlp(H, 2)

    def forward(self, b, grf):
        x = self.lin_in(b.x)
        for i, layer in enumerate(self.layers):
            if self.kind == 'linear':
                x = x + layer(x, b.batch)
            elif self.kind == 'grf':
                x = x + layer(x, grf=grf)
            elif self.kind == 'gin':
                x = self.norms[i](x + layer(x, b.edge_index))
            else:
                x = layer(x, b.edge_index, b.batch, grf=grf)
        return self.head(x)


def train_and_test(kind, train, test, seed=0, epochs=150):
    torch.manual_seed(seed)
    model = Net(kind)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    g_train, g_test = GRFLoads.from_data(train), GRFLoads.from_data(test)
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(train, g_train), train.y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(test, g_test).argmax(-1) == test.y).float().mean())


def test_dataset_labels_are_the_two_hop_majority():
    d = TwoHopMajorityDataset(num_graphs=2, num_nodes=12, seed=3)
    import networkx as nx
    from torch_geometric.utils import to_networkx
    for g in d:
        G = to_networkx(g, to_undirected=True)
        for i in range(g.num_nodes):
            ball = [j for j, dist in nx.single_source_shortest_path_length(G, i, 2).items()
                    if 1 <= dist <= 2]
            red = sum(int(g.x[j, 0]) for j in ball)
            assert int(g.y[i]) == int(red > len(ball) - red)
        assert nx.is_connected(G)
    assert repr(d) == 'TwoHopMajorityDataset(2, seed=3)'
    with pytest.raises(ValueError, match='p_red'):
        TwoHopMajorityDataset(p_red=1.5)


@pytest.mark.slow
def test_grf_attention_sees_topology():
    t = AddGraphRandomFeatures(num_walks=32, p_halt=0.3, max_length=1, seed=0)
    data = TwoHopMajorityDataset(num_graphs=64, num_nodes=60, seed=0, pre_transform=t)
    train, test = Batch.from_data_list(data[:48]), Batch.from_data_list(data[48:])
    majority = max(float(test.y.float().mean()), 1 - float(test.y.float().mean()))
    acc = {kind: train_and_test(kind, train, test) for kind in ('linear', 'grf', 'gin', 'gps')}
    print(f'majority {majority:.3f}', {k: round(v, 3) for k, v in acc.items()})
    # measured (seed 0): majority 0.667, linear 0.711, GRF 0.821, GIN 0.914, GRF-GPS 0.911
    assert acc['linear'] < majority + 0.08  # no topology: the graph's colour mix only
    assert acc['grf'] > acc['linear'] + 0.08  # a wide margin from the 2-hop mask alone
    assert acc['gps'] >= acc['gin'] - 0.02  # GRF-GPS matches GIN
