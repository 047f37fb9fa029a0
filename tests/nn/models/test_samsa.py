import pytest
import torch
from torch.nn import Parameter
from torch_geometric.data import Batch, Data

from pyg_grf.nn.models.samsa import SAMSABlock, SAMSAModel, drop_path
from pyg_grf.transforms.graph_bridge import AddGraphBridgeTokens


def graphs(sizes=((4, 6), (2, 1), (9, 14))):
    transform = AddGraphBridgeTokens()
    return Batch.from_data_list([
        transform(Data(x=torch.randn(n, 5), edge_index=torch.randint(0, n, (2, e)),
                       edge_attr=torch.randn(e, 3), y=torch.tensor([[1., 0.]])))
        for n, e in sizes
    ])


def test_samsa_block_shared_zero_residual():
    alpha = Parameter(torch.zeros(()))
    blocks = [SAMSABlock(16, heads=2, num_samples=4, residual_scale=alpha) for _ in range(2)]
    assert str(blocks[0]) == "SAMSABlock(16, heads=2, num_samples=4, mode='hard')"
    assert blocks[0].residual_scale is blocks[1].residual_scale is alpha
    x = torch.randn(10, 16)
    out = blocks[1](blocks[0](x))
    assert torch.equal(out, x)  # zero-initialised residual scale: identity at init
    out.square().sum().backward()
    assert alpha.grad is not None and alpha.grad != 0
    blocks[0].reset_parameters()  # does not touch a scale it does not own
    with torch.no_grad():
        alpha.fill_(0.5)
    blocks[0].reset_parameters()
    assert float(alpha.detach()) == 0.5
    assert not torch.equal(blocks[0](x), x)


def test_drop_path_per_graph():
    x = torch.ones(6, 4)
    batch = torch.tensor([0, 0, 0, 1, 1, 1])
    assert torch.equal(drop_path(x, 0.5, batch, training=False), x)
    torch.manual_seed(3)
    out = drop_path(x, 0.5, batch)
    for g in range(2):  # whole graphs are dropped or kept (and rescaled)
        vals = out[batch == g].unique()
        assert vals.numel() == 1 and float(vals) in (0., 2.)


def test_samsa_model_forward_backward():
    batch = graphs()
    model = SAMSAModel(5, 16, 2, num_layers=2, edge_channels=3, heads=2, num_samples=4,
                       dropout=0.1, drop_path=0.1)
    assert str(model) == ("SAMSAModel(5, 16, 2, num_layers=2, heads=2, num_samples=4, "
                          "mode='hard')")
    # one residual scale, shared by every block
    assert all(b.residual_scale is model.residual_scale for b in model.blocks)
    names = [n for n, _ in model.named_parameters() if n.endswith('residual_scale')]
    assert names == ['residual_scale']
    out = model(batch.x, batch.edge_index, batch.edge_attr, batch.batch, batch.token_type)
    assert out.shape == (3, 2)
    torch.nn.functional.binary_cross_entropy_with_logits(out, batch.y).backward()
    assert model.residual_scale.grad != 0
    # after one step the blocks receive gradient too
    with torch.no_grad():
        model.residual_scale.fill_(0.1)
    model.zero_grad()
    model(batch.x, batch.edge_index, batch.edge_attr, batch.batch).sum().backward()
    assert model.blocks[0].attn.score_lin1.weight.grad.abs().sum() > 0
    assert model.graph_bridge.pe_scale_1.grad.abs().sum() > 0


@pytest.mark.parametrize('mode', ['soft', 'hard'])
def test_samsa_model_eval_batch_equals_separate(mode):
    data = graphs()
    model = SAMSAModel(5, 16, 2, num_layers=2, edge_channels=3, heads=2, num_samples=4,
                       mode=mode).eval()
    with torch.no_grad():
        model.residual_scale.fill_(0.5)
    out = model(data.x, data.edge_index, data.edge_attr, data.batch, data.token_type)
    assert torch.equal(out, model(data.x, data.edge_index, data.edge_attr, data.batch))
    assert torch.equal(out, model(data))  # a Batch object, as the LightningModules call it
    for g, d in enumerate(data.to_data_list()):
        single = model(d.x, d.edge_index, d.edge_attr)
        assert torch.allclose(out[g], single[0], atol=1e-5)


def test_samsa_model_bad_input():
    with pytest.raises(ValueError, match='at least 1'):
        SAMSAModel(5, 16, 2, num_layers=0)
    with pytest.raises(ValueError, match='drop_path'):
        SAMSABlock(16, drop_path=1.)


def test_docs_example_runs():
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[3] / 'docs' / 'samsa.md').read_text()
    code = re.search(r'```python\n(.*?)```', text, re.S).group(1)
    exec(compile(code, 'docs/samsa.md', 'exec'), {})


@pytest.mark.parametrize('with_other', [False, True])
def test_samsa_model_on_empty_graphs(with_other):
    # a batch holding only an empty graph runs (the structural hash handles 0 elements); an
    # empty graph beside a real one does not change the real one's output
    torch.manual_seed(0)
    C = 8
    empty = Data(x=torch.zeros(0, C), edge_index=torch.zeros(2, 0, dtype=torch.long),
                 edge_attr=torch.zeros(0, C), num_nodes=0)
    real = Data(x=torch.randn(5, C), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]),
                edge_attr=torch.randn(4, C), num_nodes=5)
    model = SAMSAModel(C, 16, 2, num_layers=1, edge_channels=C, heads=2).eval()
    graphs = [empty, real] if with_other else [empty]
    out = model(Batch.from_data_list(graphs))
    assert out.shape == (len(graphs), 2) and torch.isfinite(out).all()
    if with_other:
        assert torch.allclose(out[1], model(Batch.from_data_list([real]))[0], atol=1e-5)
