r"""Issue #13: every crash, silent-wrong-answer, lost-work and code-from-data case, one test (or
more) per item. Run ``python -m pytest -q tests/test_adversarial.py`` to see them all; the
kill -9 resume test is ``-m slow``."""
import hashlib
import json
import os
import os.path as osp
import subprocess
import sys
import textwrap

import pytest
import torch

from pyg_grf.datasets import MotifDataset, load_tu
from pyg_grf.datasets.cache import DatasetCacheError
from pyg_grf.datasets.mirror import (
    MirrorIntegrityError,
    fetch_from_mirror,
    write_checksums,
)
from pyg_grf.nn.attention.gkat import RWGNKPlan

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Helpers


def _toy_mirror(root, monkeypatch, checksums=True):
    mirror = root / 'mirror'
    raw = mirror / 'TUDataset' / 'TOY' / 'raw'
    raw.mkdir(parents=True)
    (raw / 'TOY_A.txt').write_text('1, 2\n2, 1\n3, 4\n4, 3\n')
    (raw / 'TOY_graph_indicator.txt').write_text('1\n1\n2\n2\n')
    (raw / 'TOY_graph_labels.txt').write_text('0\n1\n')
    if checksums:
        write_checksums(str(mirror))
    monkeypatch.setenv('PYG_GRF_MIRROR', str(mirror))
    monkeypatch.setenv('PYG_GRF_DATA', str(root / 'data'))
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    monkeypatch.delenv('PYG_GRF_MIRROR_UNVERIFIED', raising=False)
    return mirror


class _AddConst:
    """A pre_transform whose repr shows its setting."""

    def __init__(self, value):
        self.value = value

    def __call__(self, data):
        data = data.clone()
        data.c = torch.full((data.num_nodes, 1), float(self.value))
        return data

    def __repr__(self):
        return f'_AddConst(value={self.value})'


# ---------------------------------------------------------------------------------------------
# 11. Dataset caches: atomic, verified, keyed by the transform state, one writer


def test_11_changed_pre_transform_gets_its_own_cache(tmp_path):
    a = MotifDataset(tmp_path, num_graphs=4, pre_transform=_AddConst(1))
    b = MotifDataset(tmp_path, num_graphs=4, pre_transform=_AddConst(2))  # was: stale cache
    assert a[0].c.unique().tolist() == [1.0] and b[0].c.unique().tolist() == [2.0]
    assert a.processed_dir != b.processed_dir


def test_11_changed_pre_transform_load_tu(tmp_path, monkeypatch):
    _toy_mirror(tmp_path, monkeypatch)
    assert load_tu('TOY', pre_transform=_AddConst(1))[0].c[0].item() == 1.0
    assert load_tu('TOY', pre_transform=_AddConst(2))[0].c[0].item() == 2.0


def test_11_flipped_bytes_are_detected(tmp_path):
    ds = MotifDataset(tmp_path, num_graphs=4)
    path = ds.processed_paths[0]
    raw = bytearray(open(path, 'rb').read())
    raw[len(raw) // 2] ^= 0xFF
    open(path, 'wb').write(bytes(raw))
    with pytest.raises(DatasetCacheError, match=r"SHA-256 .* modified or damaged.*Delete '.*"
                                                r"processed_.*' .* or pass force_reload=True"):
        MotifDataset(tmp_path, num_graphs=4)
    fresh = MotifDataset(tmp_path, num_graphs=4, force_reload=True)
    assert torch.equal(fresh[0].edge_index, MotifDataset(num_graphs=4)[0].edge_index)
    MotifDataset(tmp_path, num_graphs=4)  # the rewritten cache verifies


_KILL_SCRIPT = textwrap.dedent('''
    import os, signal, sys
    from pyg_grf.datasets import MotifDataset
    from pyg_grf.datasets import cache
    point = sys.argv[2]
    if point == 'save':  # die in the middle of writing the data file
        import torch_geometric.io.fs as fs
        orig = fs.torch_save
        def torch_save(data, path):
            with open(path, 'wb') as f:
                f.write(b'partial')
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        fs.torch_save = torch_save
    elif point == 'manifest':  # die after the data file, before the manifest
        def write_manifest(folder, info):
            os.kill(os.getpid(), signal.SIGKILL)
        cache.write_manifest = write_manifest
    elif point == 'replace':  # die just before the rename into place
        orig_fsync = cache._fsync_tree
        def _fsync_tree(path):
            orig_fsync(path)
            os.kill(os.getpid(), signal.SIGKILL)
        cache._fsync_tree = _fsync_tree
    MotifDataset(sys.argv[1], num_graphs=8)
''')


@pytest.mark.parametrize('point', ['save', pytest.param('manifest', marks=pytest.mark.slow),
                                   pytest.param('replace', marks=pytest.mark.slow)])
def test_11_kill_during_write_leaves_no_partial_cache(tmp_path, point):
    script = tmp_path / 'kill.py'
    script.write_text(_KILL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / 'root'), point], env=env,
                          capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    # The next load processes again (no partial file, no error) and gets the right data.
    ds = MotifDataset(tmp_path / 'root', num_graphs=8)
    ref = MotifDataset(num_graphs=8)
    assert all(torch.equal(ds[i].edge_index, ref[i].edge_index) for i in range(8))
    leftovers = [n for n in os.listdir(tmp_path / 'root' / 'MotifDataset') if '.tmp-' in n]
    assert leftovers == []


@pytest.mark.slow
def test_11_reader_waits_for_writer(tmp_path):
    # A process that opens the root while another one holds the writer's lock waits for it and
    # then reads the finished cache (it used to fail on the half-written file).
    from pyg_grf.datasets.cache import file_lock
    ds = MotifDataset.__new__(MotifDataset)
    ds.motif, ds.num_graphs, ds.seed, ds.num_nodes_er, ds.num_join_edges = \
        'caveman', 8, 0, 100, 3
    ds.features, ds.root, ds.pre_transform, ds.pre_filter = 'neighbor_degrees', str(tmp_path), \
        None, None
    lock = ds.processed_dir + '.lock'
    os.makedirs(osp.dirname(lock), exist_ok=True)
    script = ('import sys; from pyg_grf.datasets import MotifDataset; print("ready", flush=True); '
              'print(len(MotifDataset(sys.argv[1], num_graphs=8)))')
    with file_lock(lock):
        reader = subprocess.Popen([sys.executable, '-c', script, str(tmp_path)],
                                  env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE)
        assert reader.stdout.readline().decode().strip() == 'ready'
        import time
        time.sleep(1.0)
        assert reader.poll() is None, 'the reader did not wait for the writer'
    out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0 and out.decode().strip() == '8'


# ---------------------------------------------------------------------------------------------
# 14. Checkpoints build models only from allow-listed packages


def _evil_checkpoint(path, class_path, init_args, instantiator=False):
    hparams = {'model': {'class_path': class_path, 'init_args': init_args},
               'task': 'multiclass', 'num_classes': 2}
    if instantiator:  # the LightningCLI form
        hparams = {'_class_path': 'pyg_grf.lightning.tasks.GraphLevelTask',
                   '_instantiator': 'lightning.pytorch.cli.instantiate_module', **hparams}
    torch.save({'state_dict': {}, 'hyper_parameters': hparams,
                'pytorch-lightning_version': '2.6.0'}, path)


@pytest.mark.parametrize('instantiator', [False, True])
def test_14_checkpoint_cannot_run_code(tmp_path, instantiator):
    from pyg_grf.lightning.specs import UntrustedClassError
    from pyg_grf.lightning.tasks import GraphLevelTask
    marker = tmp_path / 'pwned'
    ckpt = tmp_path / 'evil.ckpt'
    _evil_checkpoint(ckpt, 'os.system', {'command': f'touch {marker}'}, instantiator)
    torch.load(ckpt, weights_only=True)  # plain dicts and strings: passes weights_only
    with pytest.raises(UntrustedClassError, match=r"Refusing to build .* 'os\.system'.*only "
                                                  r"the torch\.nn\.Module subclasses listed"):
        GraphLevelTask.load_from_checkpoint(ckpt)
    assert not marker.exists()


def test_14_allow_list_refuses_non_modules(tmp_path):
    from pyg_grf.lightning.specs import build_model as _build_model
    from pyg_grf.lightning.specs import UntrustedClassError
    from pyg_grf.lightning.tasks import GraphLevelTask
    with pytest.raises(UntrustedClassError, match="Refusing to build .* 'torch.hub.load'"):
        _build_model({'class_path': 'torch.hub.load', 'init_args': {'repo_or_dir': 'x'}})
    with pytest.raises(UntrustedClassError, match='must be a dotted name'):
        _build_model({'class_path': 'torch.nn.Linear; import os'})
    # Allowed: a torch / pyg_grf module from a checkpoint of plain data.
    assert isinstance(_build_model({'class_path': 'torch.nn.Linear',
                                    'init_args': {'in_features': 2, 'out_features': 3}}),
                      torch.nn.Linear)
    ckpt = tmp_path / 'ok.ckpt'
    _evil_checkpoint(ckpt, 'torch.nn.Linear', {'in_features': 2, 'out_features': 2})
    task = GraphLevelTask.load_from_checkpoint(ckpt, strict=False)
    assert isinstance(task.model, torch.nn.Linear)


# ---------------------------------------------------------------------------------------------
# 15-16. The mirror: never copies processed caches, verifies SHA256SUMS


def test_15_mirror_never_copies_processed_caches(tmp_path, monkeypatch):
    mirror = _toy_mirror(tmp_path, monkeypatch, checksums=False)
    evil = mirror / 'TUDataset' / 'TOY' / 'processed_0123456789abcdef'
    evil.mkdir()
    (evil / 'pre_transform.pt').write_bytes(b'pickle that runs code')
    write_checksums(str(mirror))
    # Even when the mirror's SHA256SUMS lists it, a processed* folder is not copied.
    with open(mirror / 'SHA256SUMS', 'a') as f:
        f.write(f"{hashlib.sha256(b'pickle that runs code').hexdigest()}  "
                f"TUDataset/TOY/processed_0123456789abcdef/pre_transform.pt\n")
    dest = tmp_path / 'data' / 'TUDataset' / 'TOY'
    copied = fetch_from_mirror('TUDataset/TOY')
    assert len(copied) == 3
    assert not any(p.name.startswith('processed') for p in dest.iterdir())


def test_16_mirror_tampered_file_is_refused(tmp_path, monkeypatch):
    mirror = _toy_mirror(tmp_path, monkeypatch)
    (mirror / 'TUDataset' / 'TOY' / 'raw' / 'TOY_A.txt').write_text('1, 2\n2, 1\n3, 4\n')
    with pytest.raises(MirrorIntegrityError, match=r"'TUDataset/TOY/raw/TOY_A\.txt' .* has "
                                                   r"SHA-256 .* but SHA256SUMS lists"):
        load_tu('TOY')
    assert not (tmp_path / 'data' / 'TUDataset' / 'TOY' / 'raw' / 'TOY_A.txt').exists()


def test_16_mirror_unlisted_file_and_symlink(tmp_path, monkeypatch):
    mirror = _toy_mirror(tmp_path, monkeypatch)
    raw = mirror / 'TUDataset' / 'TOY' / 'raw'
    (raw / 'TOY_node_labels.txt').write_text('0\n0\n1\n1\n')  # not in SHA256SUMS
    with pytest.raises(MirrorIntegrityError, match='not in its SHA256SUMS'):
        fetch_from_mirror('TUDataset/TOY')
    (raw / 'TOY_node_labels.txt').unlink()
    # A symlink whose target changed: its content is checked, not the link.
    outside = tmp_path / 'outside.txt'
    outside.write_text('1\n1\n2\n2\n')
    (raw / 'TOY_graph_indicator.txt').unlink()
    (raw / 'TOY_graph_indicator.txt').symlink_to(raw / 'TOY_graph_labels.txt')
    with pytest.raises(MirrorIntegrityError, match='TOY_graph_indicator.txt.*SHA-256'):
        fetch_from_mirror('TUDataset/TOY', str(tmp_path / 'dest1'))
    (raw / 'TOY_graph_indicator.txt').unlink()
    (raw / 'TOY_graph_indicator.txt').symlink_to(outside)
    with pytest.raises(MirrorIntegrityError, match='outside the mirror'):
        fetch_from_mirror('TUDataset/TOY', str(tmp_path / 'dest2'))


def test_16_mirror_without_checksums(tmp_path, monkeypatch):
    _toy_mirror(tmp_path, monkeypatch, checksums=False)
    with pytest.raises(MirrorIntegrityError, match=r'has no SHA256SUMS.*write_checksums.*'
                                                   r'PYG_GRF_MIRROR_UNVERIFIED=1'):
        load_tu('TOY')
    monkeypatch.setenv('PYG_GRF_MIRROR_UNVERIFIED', '1')
    with pytest.warns(UserWarning, match='unverified'):
        assert len(load_tu('TOY')) == 2


def test_16_shared_mirror_ships_checksums():
    from tests.conftest import mirror_path
    from pyg_grf.datasets.mirror import read_checksums
    if not mirror_path().is_dir():
        pytest.skip('no dataset mirror')
    sums = read_checksums(str(mirror_path()))
    assert sums and 'TUDataset/MUTAG/raw/MUTAG_A.txt' in sums


def test_16_edited_split_file_is_refused(tmp_path):
    from pyg_grf.datasets.splits import errica_splits
    y = torch.arange(40) % 2
    path = str(tmp_path / 'splits.json')
    folds = errica_splits(y, num_folds=4, path=path)
    stored = json.load(open(path))
    # Move a test graph of fold 0 into its training set too (a leak).
    leak = stored['folds'][0]['test'][0]
    stored['folds'][0]['train'] = sorted(stored['folds'][0]['train'] + [leak])
    json.dump(stored, open(path, 'w'))
    with pytest.raises(ValueError, match=rf"Fold 0 .* graph {leak} appears more than once .*"
                                         rf"disjoint"):
        errica_splits(y, num_folds=4, path=path)
    # A consistent-looking edit (swap a train and a test graph) is caught by the folds' hash.
    stored['folds'][0]['train'].remove(leak)
    t0, tr0 = stored['folds'][0]['test'][0], stored['folds'][0]['train'][0]
    stored['folds'][0]['test'][0], stored['folds'][0]['train'][0] = tr0, t0
    json.dump(stored, open(path, 'w'))
    with pytest.raises(ValueError, match='Graph .* test set of|do not match their stored SHA'):
        errica_splits(y, num_folds=4, path=path)
    os.remove(path)
    assert all(torch.equal(a['test'], b['test'])
               for a, b in zip(folds, errica_splits(y, num_folds=4, path=path)))


# ---------------------------------------------------------------------------------------------
# 17. Dataset names cannot leave the data root or the mirror


@pytest.mark.parametrize('name', ['../../escape_pyg', '../TOY', '/tmp/x', 'A/B', '..', ''])
def test_17_tu_name_is_sanitised(tmp_path, monkeypatch, name):
    _toy_mirror(tmp_path, monkeypatch)
    before = sorted(p for p in tmp_path.rglob('*'))
    with pytest.raises(ValueError, match='Expected a TU dataset name such as'):
        load_tu(name)
    assert sorted(p for p in tmp_path.rglob('*')) == before


def test_17_fetch_refuses_escaping_paths(tmp_path, monkeypatch):
    _toy_mirror(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="without '..'"):
        fetch_from_mirror('TUDataset/../../outside')


# ---------------------------------------------------------------------------------------------
# 1. Negative ids in rwgnk_index


def _rwgnk_inputs(N=5):
    from pyg_grf.transforms import AddRWGNKFeatures
    from torch_geometric.data import Data
    ei = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4], [1, 0, 2, 1, 3, 2, 4, 3]])
    data = AddRWGNKFeatures(4, 0.8, 1.0, 3, seed=0)(Data(edge_index=ei, num_nodes=N))
    return torch.randn(N, 8), data.rwgnk_index, data.rwgnk_value


@pytest.mark.parametrize('mode', ['linear', 'softmax', 'dense'])
@pytest.mark.parametrize('bad', [-1, 5])
def test_01_rwgnk_index_out_of_range(mode, bad):
    from pyg_grf.nn import GKATAttention
    x, index, value = _rwgnk_inputs()
    index = index.clone()
    index[1, 0] = bad  # used to abort the process ('softmax') or wrap to node 4 ('dense')
    layer = GKATAttention(8, heads=2, mode=mode)
    # a plan built from the tensors alone takes its node count from them: the id 5 then shows
    # as a plan of 6 nodes for 5 rows
    with pytest.raises(ValueError, match=rf"'rwgnk_index' must hold node ids in \[0, 5\).*refers "
                                         rf"to node {bad}|'x' has 5 rows but the RWGNK plan is "
                                         rf"of 6 nodes"):
        layer(x, rwgnk=RWGNKPlan.from_tensors(index, value))


def test_01_rwgnk_kernel_validates_its_input():
    from pyg_grf.features import rwgnk_kernel
    with pytest.raises(ValueError, match=r"must hold node ids in \[0, 3\).*node -2"):
        rwgnk_kernel(torch.tensor([[0, 1], [-2, 1]]), torch.ones(2), 3)


def test_01_index_checked_once_per_batch_tensor(monkeypatch):
    # The range check (a reduction + host read) runs once per index tensor, not in every layer.
    from pyg_grf import _validation
    from pyg_grf.nn import GKATAttention
    calls = []
    orig = _validation.torch_aminmax
    monkeypatch.setattr(_validation, 'torch_aminmax', lambda t: calls.append(1) or orig(t))
    # With the payload shared by the layers (as GraphTransformer and .payload() do): the layers'
    # remembered check once, plus once before the kernel product of the first softmax layer (a
    # product without bounds checks is never trusted to a remembered check, which a write
    # through .data could fool); the other softmax layer reuses the payload's kernel.
    x, index, value = _rwgnk_inputs()
    layers = [GKATAttention(8, heads=2, mode=m) for m in ('linear', 'softmax', 'softmax')]
    rwgnk = RWGNKPlan.from_tensors(index, value)
    for layer in layers:
        layer(x, rwgnk=rwgnk)
    assert len(calls) == 1  # once, when the plan is built; the layers read the plan
    layers[0](x, rwgnk=RWGNKPlan.from_tensors(index, value))  # a new plan: checked again
    assert len(calls) == 2


def test_01_inference_tensors_are_checked_every_time():
    # Lightning's test loop builds its batches under torch.inference_mode: such tensors have no
    # version counter (remembering them raised RuntimeError), so they are checked in every call.
    from pyg_grf.nn import GKATAttention
    x, index, value = _rwgnk_inputs()
    layer = GKATAttention(8, heads=2, mode='softmax')
    expected = layer(x, rwgnk=RWGNKPlan.from_tensors(index, value))
    with torch.inference_mode():
        x_i, index_i, value_i = x.clone(), index.clone(), value.clone()
        assert index_i.is_inference()
        for _ in range(2):
            assert torch.allclose(layer(x_i, rwgnk=RWGNKPlan.from_tensors(index_i, value_i)), expected)
        index_i[1, 0] = -1
        with pytest.raises(ValueError, match=r"'rwgnk_index' must hold node ids in \[0, 5\)"):
            layer(x_i, rwgnk=RWGNKPlan.from_tensors(index_i, value_i))


# ---------------------------------------------------------------------------------------------
# 3. SAMSA with an unsorted batch vector


@pytest.mark.parametrize('batch', [[0, 1, 0, 1, 2, 0], [2, 2, 0, 1, 1, 0], [1, 0, 1, 0, 1, 0]])
def test_03_samsa_unsorted_batch(batch):
    from pyg_grf.nn import SAMSAAttention
    torch.manual_seed(0)
    layer = SAMSAAttention(8, heads=2, num_samples=2).eval()
    x = torch.randn(6, 8)
    batch = torch.tensor(batch)
    out, index = layer(x, batch, return_index=True)
    assert out.shape == (6, 8)  # was 5, 3 or 4 rows
    # Independent reference: every graph on its own.
    for g in batch.unique():
        rows = (batch == g).nonzero().view(-1)
        ref, ref_index = layer(x[rows], return_index=True)
        assert torch.allclose(out[rows], ref, atol=1e-6)
        # The selected tokens are reported as rows of the input (support tokens as N + s).
        got = index[int(g)]
        want = torch.where((ref_index >= 0) & (ref_index < rows.numel()),
                           rows[ref_index.clamp(0, rows.numel() - 1)],
                           torch.where(ref_index >= rows.numel(), ref_index - rows.numel() + 6,
                                       ref_index))
        assert torch.equal(got, want[0])


# ---------------------------------------------------------------------------------------------
# 4. FAVOR+ never couples the graphs of a batch


def _two_graph_batch():
    from pyg_grf.transforms import AddRWGNKFeatures
    from torch_geometric.data import Batch, Data
    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    t = AddRWGNKFeatures(8, 0.8, 1.0, 3, seed=0)
    torch.manual_seed(0)
    a = t(Data(x=torch.randn(4, 128), edge_index=ei))
    b = t(Data(x=torch.randn(4, 128), edge_index=ei))
    return a, b


def _layers_favor():
    from pyg_grf.nn import GKATAttention
    from pyg_grf.nn.attention.masked import MaskedLinearAttention
    from pyg_grf.nn.attention.reference import LinearAttention
    torch.manual_seed(0)
    return {
        'gkat': GKATAttention(128, heads=2, mode='linear', feature_map='favor+'),
        'performer': LinearAttention(128, heads=2, feature_map='favor+'),
        'masked': MaskedLinearAttention(128, heads=2, feature_map='favor+'),
    }


@pytest.mark.parametrize('kind', ['gkat', 'performer', 'masked'])
def test_04_favor_output_independent_of_other_graphs(kind):
    from torch_geometric.data import Batch
    a, b = _two_graph_batch()
    layer = _layers_favor()[kind]
    # Graph B's keys sit on FAVOR+ projection directions: the largest logits a key can have
    # (|w|^2 / 2, ~32 here), far above graph A's.
    fm = layer.feature_map
    lin_k = layer.to_k
    C = fm.dim
    target = (C ** 0.25 * fm.projection[:4]).repeat(1, 2)  # [4, H * C]
    b.x = torch.linalg.lstsq(lin_k.weight, (target - (lin_k.bias if getattr(
        lin_k, 'bias', None) is not None else 0)).t()).solution.t().detach()
    batch = Batch.from_data_list([a, b])
    if kind == 'gkat':
        alone = layer(a.x, rwgnk=RWGNKPlan.from_tensors(a.rwgnk_index, a.rwgnk_value))
        together = layer(batch.x, batch.batch,
                         rwgnk=RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value))
    else:
        alone = layer(a.x)
        together = layer(batch.x, batch=batch.batch)
    # The keys used to be shifted by the batch's maximum: graph A's key features fell far below
    # the normaliser's eps and its output collapsed (changed by 9.15 of 9.2 in the report).
    assert torch.allclose(together[:4], alone, rtol=1e-5, atol=1e-5)


def test_04_favor_key_features_per_graph():
    from pyg_grf.nn.feature_maps import FAVORPlus
    torch.manual_seed(0)
    fm = FAVORPlus(8, num_features=16).double()
    k_a = torch.randn(5, 2, 8, dtype=torch.float64)
    k_b = 30 * torch.randn(5, 2, 8, dtype=torch.float64)
    batch = torch.tensor([0] * 5 + [1] * 5)
    x = k_a * 8 ** -0.25
    exact = torch.exp(x @ fm.projection.t() - 0.5 * x.pow(2).sum(-1, keepdim=True)) / 4
    phi = fm(torch.cat([k_a, k_b]), batch=batch)[:5]
    # Graph A's key features are the exact ones up to one factor per head, the same as alone.
    ratio = phi / exact
    assert torch.allclose(ratio, ratio[:1, :, :1].expand_as(ratio), rtol=1e-10)
    assert torch.allclose(phi, fm(k_a), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# 5. TreeMask with a > 0 (growing mask): no catastrophic cancellation


@pytest.mark.parametrize('dtype,a,tol', [(torch.float32, 0.05, 1e-4), (torch.float64, 0.3, 1e-10),
                                         (torch.float64, -0.3, 1e-10)])
def test_05_tree_mask_path_positive_a(dtype, a, tol):
    from pyg_grf.masks import TreeMask
    N = 300
    ei = torch.stack([torch.arange(N - 1), torch.arange(1, N)])
    mask = TreeMask(ei, N, a=a, b=0.1)
    x = torch.rand(N, 3, dtype=dtype) + 0.1
    out = mask.matmul(x)
    i = torch.arange(N, dtype=torch.float64)
    dense = torch.exp(a * (i.view(-1, 1) - i.view(1, -1)).abs() + 0.1)  # independent reference
    ref = dense @ x.double()
    rel = ((out.double() - ref).abs() / ref.abs()).max().item()
    assert rel < tol  # was 1.3 (float32, a = 0.05) and 1e23 (float64, a = 0.3)


def test_05_tree_mask_branching_tree_per_head():
    from pyg_grf.masks import TreeMask
    gen = torch.Generator().manual_seed(0)
    N = 400
    parent = (torch.rand(N - 1, generator=gen) * torch.arange(1, N)).long()  # random tree
    # plus a deep path hanging below the last node, and a star
    ei = torch.stack([torch.arange(1, N), parent])
    w = torch.rand(N - 1, generator=gen, dtype=torch.float64) + 0.5
    mask = TreeMask(ei, N, w, a=torch.tensor([0.4, -0.7, 0.05], dtype=torch.float64),
                    b=torch.tensor([0.0, 0.2, -0.1], dtype=torch.float64))
    x = torch.rand(N, 3, 2, generator=gen, dtype=torch.float64) + 0.1
    out = mask.matmul(x)
    ref = torch.einsum('hij,jhc->ihc', mask.to_dense(), x)
    assert ((out - ref).abs() / ref.abs()).max().item() < 1e-10


# ---------------------------------------------------------------------------------------------
# 12. Resume: last.ckpt after every epoch, one run folder, 'best' from a new process


def _monitored_config(tmp_path, max_epochs, **trainer):
    from tests.lightning.helpers import tiny_config, write_config
    cfg = tiny_config(tmp_path / 'run', max_epochs=max_epochs, limit_train_batches=3,
                      limit_val_batches=2, log_every_n_steps=1, **trainer)
    cfg['checkpoint'] = {'monitor': 'val/acc', 'mode': 'max', 'save_last': True}
    return write_config(tmp_path / 'c.yaml', cfg), cfg


def test_12_last_ckpt_every_epoch_and_test_best(tmp_path):
    from pyg_grf.lightning.cli import main
    config, _ = _monitored_config(tmp_path, 3)
    cli = main(['fit', '--config', config])
    last = cli.trainer.checkpoint_callback.dirpath + '/last.ckpt'
    state = torch.load(last, weights_only=True)
    # Lightning's save_last only refreshed last.ckpt when val/acc improved (epoch 0 here).
    assert (state['epoch'], state['global_step']) == (2, 9)
    best = cli.trainer.checkpoint_callback.best_model_path
    # `pyg-grf test --ckpt_path best` in a new process (as the config headers say).
    cli = main(['test', '--config', config, '--ckpt_path', 'best'])
    assert 'test/acc' in cli.trainer.callback_metrics
    from pyg_grf.lightning.cli import best_checkpoint_of
    assert best_checkpoint_of(last) == best


def test_12_test_best_without_monitor_fails_clearly(tmp_path):
    from pyg_grf.lightning.cli import main
    from tests.lightning.helpers import tiny_config, write_config
    config = write_config(tmp_path / 'c.yaml', tiny_config(tmp_path / 'run',
                                                           limit_train_batches=1,
                                                           limit_val_batches=1))
    main(['fit', '--config', config])
    with pytest.raises(FileNotFoundError, match=r"--ckpt_path best: no best checkpoint found.*"
                                                r"checkpoint\.monitor"):
        main(['test', '--config', config, '--ckpt_path', 'best'])


def _fit_subprocess(config, root, kill=None, resume=False):
    # the test-only callback of the config is outside the CLI's allow-lists: trusted explicitly
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='1',
               PYG_GRF_TEST_KILL=kill or 'never',
               PYG_GRF_TRUSTED_CLASSES='tests.lightning.helpers.KillAt')
    args = [sys.executable, '-m', 'pyg_grf.lightning.cli', 'fit', '--config', config,
            f'--trainer.default_root_dir={root}']
    if resume:
        args.append('--ckpt_path=last')
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    assert proc.returncode == (-9 if kill else 0), proc.stderr[-3000:]


@pytest.mark.slow
def test_12_kill_9_and_resume_equals_uninterrupted_run(tmp_path):
    import yaml
    _, cfg = _monitored_config(tmp_path, 5)
    cfg['trainer']['callbacks'] = [{'class_path': 'tests.lightning.helpers.KillAt'}]
    config = str(tmp_path / 'kill.yaml')
    yaml.safe_dump(cfg, open(config, 'w'))

    straight = tmp_path / 'straight'
    _fit_subprocess(config, straight)
    resumed = tmp_path / 'resumed'
    # Killed: inside epoch 1, after epoch 2's training (before its checkpoint), at the end of
    # epoch 3's validation; each time resumed with --ckpt_path=last.
    _fit_subprocess(config, resumed, kill='batch:1:1')
    _fit_subprocess(config, resumed, kill='trainend:2', resume=True)
    _fit_subprocess(config, resumed, kill='valend:3', resume=True)
    _fit_subprocess(config, resumed, resume=True)

    def run_dir(root):
        versions = sorted(os.listdir(root / 'lightning_logs'))
        assert versions == ['version_0']  # one folder: best tracking continues
        return root / 'lightning_logs' / 'version_0'

    a, b = run_dir(straight), run_dir(resumed)
    rows_a = [json.loads(line) for line in open(a / 'epoch_metrics.jsonl')]
    rows_b = [json.loads(line) for line in open(b / 'epoch_metrics.jsonl')]
    assert [r['epoch'] for r in rows_b] == [0, 1, 2, 3, 4]  # none lost, none repeated
    assert rows_a == rows_b  # the same metrics, epoch by epoch
    assert sorted(os.listdir(a / 'checkpoints')) == sorted(os.listdir(b / 'checkpoints'))
    last_a = torch.load(a / 'checkpoints' / 'last.ckpt', weights_only=True)
    last_b = torch.load(b / 'checkpoints' / 'last.ckpt', weights_only=True)
    key = next(k for k in last_a['callbacks'] if k.startswith('AtomicModelCheckpoint'))
    assert last_a['callbacks'][key]['best_model_score'] == \
        last_b['callbacks'][key]['best_model_score']
    for name, value in last_a['state_dict'].items():
        assert torch.allclose(value, last_b['state_dict'][name], atol=1e-6), name


# ---------------------------------------------------------------------------------------------
# 13. Memory estimate before a huge allocation


def _big_graph(N=100_000):
    # A ring (2 N edges): only its size matters, nothing large is allocated when refused.
    i = torch.arange(N)
    return torch.stack([torch.cat([i, (i + 1) % N]), torch.cat([(i + 1) % N, i])])


def test_13_sample_walks_refuses_with_estimate(monkeypatch):
    from pyg_grf import memory, walks
    monkeypatch.delenv('PYG_GRF_MEMORY_LIMIT', raising=False)
    monkeypatch.setattr(memory, 'available_memory', lambda device=None: 16 * 2**30)
    ei = _big_graph()
    with pytest.raises(walks.WalkMemoryError, match=r"num_walks=10000 = 1000000000 walkers.* "
                                                    r"about \d+\.\d GiB, more than 90% of the "
                                                    r"available memory.*Lower 'num_walks'.*"
                                                    r"memory_limit=float\('inf'\).*"
                                                    r"PYG_GRF_MEMORY_LIMIT=off"):
        walks.sample_walks(ei, 100_000, 10_000, 0.5, 4)
    # The transform goes through sample_walks and refuses the same way (was an OOM kill).
    from torch_geometric.data import Data
    from pyg_grf.transforms import AddRWGNKFeatures
    with pytest.raises(walks.WalkMemoryError):
        AddRWGNKFeatures(10_000, 0.8, 1.0, 4, p_halt=0.5)(Data(edge_index=ei, num_nodes=100_000))


def test_13_memory_limit_override(monkeypatch):
    from pyg_grf import walks
    ei = _big_graph(1000)
    with pytest.raises(walks.WalkMemoryError, match='more than memory_limit'):
        walks.sample_walks(ei, 1000, 8, 0.5, 4, memory_limit=1e5)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '100K')
    with pytest.raises(walks.WalkMemoryError, match=r'more than \$PYG_GRF_MEMORY_LIMIT'):
        walks.sample_walks(ei, 1000, 8, 0.5, 4)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', 'off')
    assert walks.sample_walks(ei, 1000, 8, 0.5, 4).num_walkers == 8000
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', 'lots')
    with pytest.raises(ValueError, match="PYG_GRF_MEMORY_LIMIT must be a size such as '64G'"):
        walks.sample_walks(ei, 1000, 8, 0.5, 4)


def test_13_estimate_bounds_the_outputs():
    # The estimate is at least what the returned walks hold (independent: their tensor sizes).
    from pyg_grf.walks import estimate_walk_memory, sample_walks
    ei = _big_graph(5000)
    w = sample_walks(ei, 5000, 16, 0.2, 6, generator=torch.Generator().manual_seed(0))
    held = sum(t.numel() * t.element_size() for t in (w.start, w.length, w.order, w.node, w.edge))
    est = estimate_walk_memory(5000, 16, 6, 0.2, num_edges=ei.size(1), num_nodes=5000)
    assert held <= est <= 6 * held


# ---------------------------------------------------------------------------------------------
# 7. The sampler picks a neighbour with probability exactly 1/d


def test_07_neighbour_choice_unbiased_at_high_degree():
    from pyg_grf.walks import sample_walks
    d = 3 * 2**19 + 1  # 1,572,865 leaves of one node
    # Reference, independent of the sampler: how often a float32 uniform (2^24 values j / 2^24)
    # times d lands on each leaf. About 2/3 of the leaves get 11 values, 1/3 get 10, so with
    # float32 those leaves are chosen with probability 11 / 2^24 instead of 1 / d.
    u = torch.arange(2**24, dtype=torch.float32) * 2.0**-24
    hits = torch.bincount((u * d).long().clamp_max_(d - 1), minlength=d)
    favoured = hits > hits.min()
    del u, hits
    leaves = torch.arange(1, d + 1)
    ei = torch.stack([torch.zeros(d, dtype=torch.long), leaves])
    n = 200_000
    walks = sample_walks(ei, d + 1, n, None, 1, fixed_length=True, start=torch.tensor([0]),
                         generator=torch.Generator().manual_seed(0))
    got = favoured[walks.node - 1].double().mean().item()
    exact = favoured.double().mean().item()  # a uniform choice
    sigma = (exact * (1 - exact) / n) ** 0.5
    # float32: ~0.69, about 20 sigma from the exact fraction; now within 5 sigma.
    assert abs(got - exact) < 5 * sigma, (got, exact, sigma)


# ---------------------------------------------------------------------------------------------
# 9. Seeds: fresh walks per access, different walks in every DataLoader worker, reproducible


class _SameGraph(torch.utils.data.Dataset):
    def __init__(self, transform, n=4):
        from torch_geometric.data import Data
        ei = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 0, 0, 2], [1, 0, 2, 1, 3, 2, 0, 3, 2, 0]])
        self.data, self.transform, self.n = Data(edge_index=ei, num_nodes=4), transform, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.transform(self.data)


def _walk_signatures(transform, attr, num_workers, epochs=1):
    from torch_geometric.loader import DataLoader
    torch.manual_seed(0)
    loader = DataLoader(_SameGraph(transform), batch_size=1, num_workers=num_workers)
    return [tuple(getattr(b, attr).tolist()) for _ in range(epochs) for b in loader]


def _check_seed_semantics(make, attr):
    # Main process: fresh walks at every access, same sequence for the same seed.
    a = _walk_signatures(make(), attr, 0, epochs=2)
    assert len(set(a)) == len(a)  # 8 accesses of one graph: all different walks
    assert a == _walk_signatures(make(), attr, 0, epochs=2)
    # Two workers: they do not repeat each other's walks (they used to: one stream copied into
    # every worker), every epoch is new, and the whole run is reproducible.
    b = _walk_signatures(make(), attr, 2, epochs=2)
    assert len(set(b)) == len(b)
    assert b == _walk_signatures(make(), attr, 2, epochs=2)


def test_09_rwgnk_seed_semantics():
    from pyg_grf.transforms import AddRWGNKFeatures
    _check_seed_semantics(lambda: AddRWGNKFeatures(4, 0.8, 1.0, 3, p_halt=0.3, seed=5),
                          'rwgnk_value')


def test_09_grf_seed_semantics():
    from pyg_grf.transforms import AddGraphRandomFeatures
    _check_seed_semantics(lambda: AddGraphRandomFeatures(num_walks=4, max_length=3, seed=5),
                          'grf_load')


def test_09_transform_rng_helper():
    import copy
    import pickle
    from pyg_grf.transforms._seeding import TransformRNG
    assert TransformRNG(None).generator() is None
    rng = TransformRNG(3)
    first = torch.rand(4, generator=rng.generator())
    assert torch.equal(first, torch.rand(4, generator=torch.Generator().manual_seed(3)))
    second = torch.rand(4, generator=rng.generator())  # advances, no re-seeding
    assert not torch.equal(first, second)
    clone = pickle.loads(pickle.dumps(rng))  # the state travels with a copy
    assert torch.equal(torch.rand(4, generator=clone.generator()),
                       torch.rand(4, generator=copy.deepcopy(rng).generator()))
    with pytest.raises(ValueError, match="'seed' must be an integer or None"):
        TransformRNG('7')


# ---------------------------------------------------------------------------------------------
# 6. Directed graphs: 'sym' normalisation and the kernel claim


def test_06_sym_normalisation_of_an_edge_into_a_sink():
    from pyg_grf.features import normalized_adjacency
    ei = torch.tensor([[0, 0, 1], [1, 2, 2]])  # 2 is a sink
    w = normalized_adjacency(ei, 3, normalization='sym')
    # D_out^-1/2 A D_in^-1/2: out-degrees (2, 1, 0), in-degrees (0, 1, 2).
    ref = torch.tensor([1 / (2 * 1) ** 0.5, 1 / (2 * 2) ** 0.5, 1 / (1 * 2) ** 0.5])
    assert torch.allclose(w, ref)  # the edges into the sink used to get weight 0


def test_06_directed_graph_warns_and_estimates_F():
    from pyg_grf.features import DirectedGraphWarning, graph_random_features
    from pyg_grf.features.exact import dense_adjacency
    ei = torch.tensor([[0, 0, 1, 2, 3, 1], [1, 2, 2, 3, 1, 3]])  # directed, no sinks
    f = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    with pytest.warns(DirectedGraphWarning, match=r'not symmetric .* estimates F F\^T, not the '
                                                  r'power-series kernel'):
        phi = graph_random_features(ei, 4, f, 20000, 0.3, 2,
                                    generator=torch.Generator().manual_seed(0)).to_dense()
    W = dense_adjacency(ei, 4, normalization='sym').double()
    F = f[0] * torch.eye(4, dtype=torch.float64) + f[1] * W + f[2] * W @ W
    assert torch.allclose(phi, F, atol=0.03)  # unbiased for F = sum_l f_l W^l
    # ... and Phi Phi^T is near F F^T, far from sum_k (f*f)_k W^k, which the docs claimed.
    ff = torch.tensor([1.0, 1.0, 0.75, 0.25, 0.0625], dtype=torch.float64)
    series = sum(c * torch.linalg.matrix_power(W, k) for k, c in enumerate(ff))
    gram = phi @ phi.t()
    off = ~torch.eye(4, dtype=torch.bool)
    assert (gram - F @ F.t())[off].abs().max() < 0.05 < (gram - series)[off].abs().max()


def test_06_symmetric_graph_does_not_warn():
    import warnings as _w
    from pyg_grf.features import graph_random_features
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    with _w.catch_warnings():
        _w.simplefilter('error')
        graph_random_features(ei, 3, [1.0, 0.5], 4, 0.5, 1)


# ---------------------------------------------------------------------------------------------
# Items 2, 8, 10: GRF loads are validated once per batch by GRFLoads (ids, hops, finite loads),
# overflowing loads are refused by the transform, and a layer shorter than the loads refuses.


def _grf_batch():
    from torch_geometric.data import Batch, Data
    from pyg_grf.transforms import AddGraphRandomFeatures
    t = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=0)
    ring = torch.tensor([[0, 1, 2, 3, 1, 2, 3, 0], [1, 2, 3, 0, 0, 1, 2, 3]])
    return Batch.from_data_list([t(Data(x=torch.randn(4, 8), edge_index=ring))
                                 for _ in range(2)])


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
def test_02_negative_grf_index_is_refused(backend):
    from pyg_grf.features import GRFLoads
    from pyg_grf.nn import GRFAttention
    b = _grf_batch()
    bad = b.grf_index.clone()
    bad[1, 2] = -1  # used to become the mask entry (r - 1, N - 1)
    layer = GRFAttention(8, heads=2, max_length=3, backend=backend)
    with pytest.raises(ValueError, match=r"node ids in \[0, 8\), got ids in \[-1, 7\]"):
        layer(b.x, b.batch, grf=GRFLoads(bad, b.grf_length, b.grf_load, b.x.size(0),
                                         batch=b.batch))


def test_08_overflowing_loads_are_refused():
    from torch_geometric.data import Data
    from pyg_grf.features import GRFLoads
    from pyg_grf.transforms import AddGraphRandomFeatures
    from tests.utils import er_graph
    d = Data(edge_index=er_graph(60, 0.9, seed=0), num_nodes=60)
    with pytest.raises(ValueError, match='overflowed float32'):
        AddGraphRandomFeatures(num_walks=4, p_halt=0.01, max_length=60, normalization=None,
                               seed=0)(d)
    b = _grf_batch()
    load = b.grf_load.clone()
    load[0] = float('inf')  # 0 * inf used to give NaN where f or truncation should give 0
    with pytest.raises(ValueError, match='non-finite'):
        GRFLoads(b.grf_index, b.grf_length, load, b.num_nodes)


def test_10_max_length_mismatch_is_refused():
    from pyg_grf.features import GRFLoads
    from pyg_grf.nn import GRFAttention
    b = _grf_batch()
    layer = GRFAttention(8, heads=2, max_length=1)  # the transform used max_length=3
    with pytest.raises(ValueError, match=r'hop counts up to 3 but GRFAttention\(max_length=1\)'):
        layer(b.x, grf=GRFLoads.from_data(b))


# ---------------------------------------------------------------------------------------------
# Item 18: no torch.load without weights_only anywhere in the product (package, benchmarks,
# experiments), so no file read by our code can run code on load.


def test_18_every_torch_load_sets_weights_only():
    import re
    offenders = []
    for top in ('pyg_grf', 'bench', 'experiments'):
        for dirpath, _, files in os.walk(osp.join(REPO, top)):
            for name in files:
                if not name.endswith('.py'):
                    continue
                path = osp.join(dirpath, name)
                text = open(path).read()
                for m in re.finditer(r'torch\.load\(', text):
                    call = text[m.start():text.find(')', m.start()) + 1]
                    if 'weights_only' not in call:
                        offenders.append(f'{osp.relpath(path, REPO)}: {call}')
    assert offenders == []
