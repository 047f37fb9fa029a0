r"""The product on a GPU in one prepared run (issue 34): CUDA tests, whole GPS training steps and
attention layers against PyG's, peak memory, and the host synchronisations inside a layer.

Written for the lent GPU machine (one H100 or H200, torch 2.11 + CUDA 13, torch-geometric 2.8,
lightning, torchmetrics, numba; no jsonargparse, ogb, rdkit, no network), so it imports nothing
else and only the public API of ``pyg_grf`` (transforms, layers, the documented call
``attn(x, batch, **attn.payload(data))``, :func:`pyg_grf.loader.prepare_payload`,
:class:`~pyg_grf.nn.attention.grf.GRFPlan` and :func:`pyg_grf.memory.memory_budget`), from the
source tree. It fits in 8 minutes on one H100 (``--budget``, default 450 s for all sections
together). Sections, each guarded (an error is recorded and the next section runs) and
time-boxed:

* ``nvidia_smi``: the output of ``nvidia-smi`` (skipped on the CPU);
* ``cuda_tests``: ``python -m pytest -m cuda tests/device tests/test_ops.py -q`` in a
  subprocess with a timeout (skipped on the CPU);
* ``gps_step``: a whole training step (fresh batch object, the attention's payload, forward, loss,
  backward, ``Adam`` step) of a 2-layer GPS model (``GINEConv`` local branch, 64 channels,
  4 heads) with ``pyg_grf.nn.GRFGPSConv(attn_type='grf')`` against PyG's ``GPSConv`` with
  ``attn_type='multihead'`` and ``'performer'`` at equal width (4 x 16), on a molecule-sized
  (Peptides-like: 128 graphs of 120-180 nodes) and a TU-sized (128 graphs of 20-40 nodes)
  synthetic batch, in float32 and under bfloat16 autocast. Two GRF-GPS columns: the batch's
  plan built in the step (as for a batch never seen before: the plan a layer keeps from its
  last call is dropped first), and the plan built in the loader
  (:func:`pyg_grf.loader.prepare_payload` on the batch before the timed steps, as
  ``pyg_grf.loader.DataLoader`` does in its workers: the fresh batch object keeps the
  ``grf_plan`` field);
* ``knn``: one attention layer, forward + backward, 4 heads x 16 channels, on kNN graphs (k=8,
  points on a jittered 2-D grid) of 65,536 to 4,194,304 nodes: ``GRFAttention`` against PyG's
  ``PerformerAttention`` and unmasked linear attention (``attn_type='linear'`` of the registry);
  time and ``torch.cuda.max_memory_allocated``; a method stops growing at its first
  out-of-memory (the largest size that fit is recorded);
* ``gkat``: ``GKATAttention`` (the paper's GAT-shaped layer, 8 heads x 8) against PyG's
  ``GATConv`` on a PubMed-sized random graph (19,717 nodes, ~88.6k directed edges, 500
  features), forward + backward;
* ``profile``: where the device time goes (``torch.profiler``, the operators with the most
  self time on the device): GRF forward + backward per backend on the 262,144-node kNN graph,
  and one GRF-GPS training step on the molecule batch;
* ``backends``: the one rule of ``backend='auto'`` on this device: for GRF on the 262k- and
  1M-node kNN graphs and on a power-law graph of PubMed's size (hubs: the walks of many nodes
  overlap), the engine (``'pairs'``, the mask on its support) against the low-rank path
  (``'sparse'``): the plan's build time and peak memory, the layer's forward + backward and the
  peak memory of its first call; and which backend ``'auto'`` picks (``'pairs'`` when its join
  and one layer fit the memory budget and it counts no more multiply-adds than ``'sparse'``,
  else ``'sparse'``), beside the faster of the two;
* ``sync``: the host synchronisations inside one layer's forward and backward, counted with
  ``torch.cuda.set_sync_debug_mode('warn')`` after the batch's payload (its plan) is built:
  first call and second call separately;
* ``op_count``: ``python bench/op_count.py --graphs 128 --compile --out OUT/op_count`` in a
  subprocess with a timeout (operators per training step on the CPU, and what
  ``torch.compile`` makes of the GRF model), so that the GPU session records it too
  (``--quick``: ``--graphs 4``, without ``--compile``);
* ``pair_kernel``: the engine's pair kernel (sampled product and CSR products, cuSPARSE on a
  GPU) against the same sums by gathers and one scatter (``index_add_`` or
  ``segment_reduce``), every head in one call, forward + backward, fp32 and bf16, on the plans
  of the molecule batch and of a 65k-node kNN graph, with the outputs' and gradients' relative
  difference to the engine: which kernel is cheaper on this device.

Each section runs in its own process on CUDA (a crash or a poisoned CUDA context loses one
section, and a hang is killed at the section's time limit), in-process on the CPU
(``--isolation``). Results are written as they come: ``OUT/sections/<name>.json`` after every
measurement, ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` (the summary, ratios beside their
baselines) after every section; logs in ``OUT/logs/``. Usage, from the repository root::

    python bench/gpu_check.py --out OUT                      # on the GPU machine (cuda if present)
    python bench/gpu_check.py --out OUT --device cpu --quick  # the same paths, tiny, < 1 minute
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the package from the source tree, not an installed copy
    sys.path.insert(0, str(ROOT))

import torch_geometric  # noqa: E402
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.nn import GATConv, GINEConv, GPSConv, global_mean_pool  # noqa: E402
from torch_geometric.nn.attention import PerformerAttention  # noqa: E402
from torch_geometric.utils import to_undirected  # noqa: E402

from pyg_grf.loader import prepare_payload  # noqa: E402
from pyg_grf.nn import GKATAttention, GRFAttention, GRFGPSConv  # noqa: E402
from pyg_grf.nn.attention.grf import GRFPlan  # noqa: E402
from pyg_grf.nn.attention.registry import attention_resolver  # noqa: E402
from pyg_grf.transforms import AddGraphRandomFeatures, AddRWGNKFeatures  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_batch import molecule_like  # noqa: E402  (the molecule-like batches of bench/)

C, H = 64, 4                      # width and heads of every GPS block and attention layer
IN_NODE, IN_EDGE, OUT = 16, 4, 10  # synthetic node / edge features, graph labels
MAX_LENGTH = 4
# walk loads: the Peptides configs' settings for the GPS batches, bench_batch.py's (shorter
# walks) for the single layers on large graphs
GPS_WALKS = dict(num_walks=16, p_halt=0.2, max_length=MAX_LENGTH, seed=0)
KNN_WALKS = dict(num_walks=16, p_halt=0.5, max_length=MAX_LENGTH, seed=0)
NODE_WALKS = dict(num_walks=32, p_halt=0.25, max_length=3, seed=0)  # node configs' walks
RWGNK_WALKS = dict(num_walks=16, lam=0.8, alpha=1.0, max_length=2, seed=0,  # citation_gkat.yaml
                   kernel_threshold=0.05)

SECTIONS = ('nvidia_smi', 'cuda_tests', 'gps_step', 'knn', 'gkat', 'sync', 'profile', 'backends',
            'op_count', 'pair_kernel')
# each section's share of the budget (their sum, 765 s, is scaled to the budget)
CAPS = {'nvidia_smi': 20, 'cuda_tests': 140, 'gps_step': 100, 'knn': 130, 'gkat': 30, 'sync': 35,
        'profile': 60, 'backends': 90, 'op_count': 120, 'pair_kernel': 40}
# GRF_LOADER: GRF-GPS with the batch's plan built before the step (prepare_payload)
MHA, PERF, GRF = 'GPS multihead', 'GPS performer 4x16', 'GRF-GPS'
GRF_LOADER = 'GRF-GPS, plan in loader'
KNN_SIDES = (256, 512, 1024, 2048)          # 65,536 ... 4,194,304 nodes
OOM_TEXT = ('out of memory', 'CUBLAS_STATUS_ALLOC_FAILED', 'CUSPARSE_STATUS_ALLOC_FAILED',
            'CUSPARSE_STATUS_INSUFFICIENT_RESOURCES')


# Recording ########################################################################################


class Section:
    r"""The results of one section, written to ``OUT/sections/<name>.json`` at every
    :meth:`save` (so that a killed section keeps what it measured)."""

    def __init__(self, out: Path, name: str, device: torch.device, quick: bool, deadline: float):
        self.path = out / 'sections' / f'{name}.json'
        self.device = device
        self.quick = quick
        self.deadline = deadline
        self.data = {'name': name, 'status': 'running', 'device': str(device), 'rows': []}

    def left(self) -> float:
        return self.deadline - time.time()

    def add(self, row: dict) -> dict:
        self.data['rows'].append(row)
        self.save()
        return row

    def save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix('.tmp')
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def is_oom(exc: BaseException) -> bool:
    r"""Whether ``exc`` means the device ran out of memory (torch's error, a cuBLAS/cuSPARSE
    allocation failure, or the package's ``BackendMemoryError``, a ``MemoryError``)."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or any(
        t in str(exc) for t in OOM_TEXT)


def error_text(exc: BaseException) -> str:
    return f'{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ""}'[:300]


def free(device: torch.device):
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


# Timing ###########################################################################################


def sync(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def round_robin(fns: dict, device: torch.device, repeats: int, warmup: int,
                deadline: float) -> dict:
    r"""Seconds per call of every function: ``warmup`` calls of each, then ``repeats`` rounds
    of one call of each (calls of one round share the machine's state); stops early (at least
    one round) at ``deadline``. A function that raises is dropped and its error returned
    under ``'errors'``."""
    times, errors = {k: [] for k in fns}, {}
    live = dict(fns)
    for k, fn in list(live.items()):
        try:
            for _ in range(warmup):
                fn()
            sync(device)
        except Exception as exc:  # recorded, the other columns go on
            errors[k] = error_text(exc)
            del live[k]
            free(device)
    for r in range(repeats):
        if r > 0 and time.time() > deadline:
            break
        for k, fn in list(live.items()):
            try:
                times[k].append(timed(fn, device))
            except Exception as exc:
                errors[k] = error_text(exc)
                del live[k]
                free(device)
    return {'times': {k: v for k, v in times.items() if v}, 'errors': errors}


def quartiles(x: list) -> list:
    if len(x) < 2:
        return [x[0], x[0], x[0]]
    q = statistics.quantiles(x, n=4, method='inclusive')
    return [statistics.median(x), q[0], q[2]]


def round_ratio(times: dict, col: str, base: str):
    r"""Median over rounds of ``time[col] / time[base]`` (:obj:`None` if either is missing)."""
    if col not in times or base not in times:
        return None
    return statistics.median(a / b for a, b in zip(times[col], times[base]))


@contextlib.contextmanager
def peak_memory(device: torch.device, rec: dict):
    r"""Records ``torch.cuda.max_memory_allocated`` over the block (``peak_bytes``) and its
    excess over the memory allocated when the block started (``extra_bytes``); :obj:`None`
    on the CPU."""
    if device.type != 'cuda':
        rec.update(peak_bytes=None, extra_bytes=None)
        yield
        return
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    yield
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    rec.update(peak_bytes=peak, extra_bytes=peak - base)


# Workloads ########################################################################################


def molecule_batch(num_graphs: int, lo: int, hi: int, seed: int, device: torch.device,
                   rwgnk=False) -> Batch:
    r"""``num_graphs`` molecule-like graphs of ``lo``-``hi`` nodes with node and edge features,
    10 binary labels and GRF walk loads (``GPS_WALKS``; RWGNK features too with ``rwgnk``:
    ``True`` for ``RWGNK_WALKS``, or a dict of ``AddRWGNKFeatures`` arguments), collated and
    moved to ``device`` once."""
    gen = torch.Generator().manual_seed(seed)
    grf = AddGraphRandomFeatures(**GPS_WALKS)
    kernel = AddRWGNKFeatures(**(rwgnk if isinstance(rwgnk, dict) else RWGNK_WALKS)) \
        if rwgnk else None
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        ei = molecule_like(n, gen)
        data = grf(Data(x=torch.randn(n, IN_NODE, generator=gen), edge_index=ei,
                        edge_attr=torch.randn(ei.size(1), IN_EDGE, generator=gen),
                        y=torch.randint(0, 2, (1, OUT), generator=gen).float(), num_nodes=n))
        graphs.append(kernel(data) if kernel is not None else data)
    return Batch.from_data_list(graphs).to(device)


def fresh(b: Batch) -> Batch:
    r"""A new batch object holding the same tensors: what a training loop meets at every step
    (nothing that an earlier step kept on the object is found again)."""
    return type(b)(**b.to_dict())


def knn_graph(side: int, device: torch.device, k: int = 8, seed: int = 0) -> Data:
    r"""The symmetrised k-nearest-neighbour graph (``k <= 8``) of ``side**2`` points on a
    jittered grid (point ``(i, j) + u``, ``u`` uniform in ``[-0.3, 0.3]^2``), built on
    ``device`` in ``O(N)`` as a top-k over the 24 other points of the 5 x 5 window of grid
    cells around each point. That is the exact kNN for every point two or more cells from the
    border (its 8 ring neighbours lie within ``1.6 * sqrt(2) < 2.4``, every point outside the
    window farther); near the border, where fewer candidates lie inside, it is the kNN among
    the window (99.5 % of the rows exact on a 20 x 20 grid, all but near the corners)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    n = side * side
    ij = torch.stack(torch.meshgrid(torch.arange(side, device=device),
                                    torch.arange(side, device=device), indexing='ij'), -1)
    ij = ij.reshape(n, 2)
    pos = ij.float() + (torch.rand(n, 2, generator=gen, device=device) - 0.5) * 0.6
    d = torch.arange(-2, 3, device=device)
    off = torch.stack(torch.meshgrid(d, d, indexing='ij'), -1).reshape(-1, 2)
    off = off[(off != 0).any(-1)]                                      # [24, 2]
    cand = ij.unsqueeze(1) + off                                        # [N, 24, 2]
    ok = ((cand >= 0) & (cand < side)).all(-1)
    cand_id = cand[..., 0].clamp(0, side - 1) * side + cand[..., 1].clamp(0, side - 1)
    dist = (pos[cand_id] - pos.unsqueeze(1)).pow(2).sum(-1).masked_fill(~ok, float('inf'))
    nearest = dist.topk(k, dim=1, largest=False).indices               # [N, k], all inside
    col = cand_id.gather(1, nearest).reshape(-1)
    row = torch.arange(n, device=device).repeat_interleave(k)
    edge_index = to_undirected(torch.stack([row, col]), num_nodes=n)
    return Data(edge_index=edge_index, num_nodes=n)


def power_law(device: torch.device, quick: bool, seed: int = 0) -> Data:
    r"""A Barabasi-Albert graph (2 edges per new node) of PubMed's node count (2,000 with
    ``quick``) with the node configs' walks (``NODE_WALKS``): its hubs make the walks of many
    nodes overlap, so the symmetric mask has about 50x as many cells as the walks have pairs
    (the case where ``'auto'`` counts the low-rank path cheaper)."""
    from torch_geometric.utils import barabasi_albert_graph
    n = 2000 if quick else 19717
    torch.manual_seed(seed)
    data = Data(edge_index=barabasi_albert_graph(n, 2), num_nodes=n)
    return AddGraphRandomFeatures(**NODE_WALKS)(data).to(device)


def pubmed_like(device: torch.device, quick: bool, seed: int = 0) -> Data:
    r"""A random graph of PubMed's size (19,717 nodes, 44,324 undirected edges: 88,648
    directed) with 500 random features and RWGNK features (``RWGNK_WALKS``)."""
    gen = torch.Generator().manual_seed(seed)
    n, m, f = (300, 700, 32) if quick else (19717, 44324, 500)
    ei = torch.randint(0, n, (2, int(m * 1.05)), generator=gen)
    ei = ei[:, ei[0] != ei[1]]
    ei = to_undirected(ei, num_nodes=n)
    data = Data(x=torch.randn(n, f, generator=gen), edge_index=ei, num_nodes=n)
    return AddRWGNKFeatures(**RWGNK_WALKS)(data).to(device)


# Models ###########################################################################################


def gine() -> GINEConv:
    return GINEConv(nn.Sequential(nn.Linear(C, C), nn.ReLU(), nn.Linear(C, C)))


def gps_block(column: str) -> nn.Module:
    r"""One GPS block of ``column`` (``GRF`` and ``GRF_LOADER``: the same GRF-GPS block)."""
    if column == MHA:
        return GPSConv(C, gine(), heads=H, attn_type='multihead')
    if column == PERF:  # equal width: 4 heads x 16 channels (PyG's default is 4 x 64)
        return GPSConv(C, gine(), heads=H, attn_type='performer',
                       attn_kwargs={'head_channels': C // H})
    return GRFGPSConv(C, gine(), heads=H, attn_type='grf', attn_kwargs={'max_length': MAX_LENGTH})


class GPSNet(nn.Module):
    r"""Node and edge encoders, two GPS blocks of ``column``, mean pooling, a linear head."""

    def __init__(self, column: str):
        super().__init__()
        self.node_enc = nn.Linear(IN_NODE, C)
        self.edge_enc = nn.Linear(IN_EDGE, C)
        self.layers = nn.ModuleList([gps_block(column) for _ in range(2)])
        self.head = nn.Linear(C, OUT)

    def forward(self, data: Batch) -> torch.Tensor:
        # the attention's payload, once per batch, shared by both blocks (empty for PyG's): the
        # plan the batch carries (prepare_payload), else the one the layer kept for these
        # tensors, else a new one
        first = self.layers[0]
        payload = first.payload(data) if isinstance(first, GRFGPSConv) else {}
        x, edge_attr = self.node_enc(data.x), self.edge_enc(data.edge_attr)
        for layer in self.layers:
            x = layer(x, data.edge_index, data.batch, **payload, edge_attr=edge_attr)
        return self.head(global_mean_pool(x, data.batch, size=data.num_graphs))


def forget_plans(model: nn.Module):
    r"""Drops the plan that each attention layer of ``model`` keeps from its last call (a layer
    reuses it while the batch holds the same tensors, as ``GCNConv(cached=True)`` does), so
    that the next step builds the plan as for a batch never seen before (as
    ``bench/op_count.py`` does for its 'plan in the step' row)."""
    for m in model.modules():
        m.__dict__.pop('_plan_cache', None)


def gps_step(column: str, b: Batch, device: torch.device, bf16: bool):
    r"""One training step of ``column`` on a fresh batch object holding ``b``'s tensors.
    ``GRF``: the plan built in the step; ``GRF_LOADER``: built here, once, by
    :func:`~pyg_grf.loader.prepare_payload` on a copy of the batch (``b`` itself stays without
    a plan), whose ``grf_plan`` field every fresh batch object keeps."""
    torch.manual_seed(0)
    model = GPSNet(GRF if column == GRF_LOADER else column).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    cast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    if column == GRF_LOADER:
        b = prepare_payload(model, fresh(b))  # what the loader's collate function does

    def step():
        if column == GRF:
            forget_plans(model)
        data = fresh(b)
        opt.zero_grad(set_to_none=True)
        with cast:
            out = model(data)
        loss = F.binary_cross_entropy_with_logits(out.float(), data.y)
        loss.backward()
        opt.step()
    return step


# Sections #########################################################################################


def run_command(cmd: list, timeout: float):
    r"""``(output, return code)`` of ``cmd`` run in the repository root; a command killed at
    ``timeout`` seconds returns what it printed and :obj:`None`."""
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        return r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b'').decode() if isinstance(exc.stdout, bytes) else (exc.stdout or '')
        return text + f'\n[killed after {timeout:.0f} s]', None


def run_nvidia_smi(S: Section, out: Path):
    if S.device.type != 'cuda':
        S.data.update(status='skipped', reason='not a CUDA device')
        return
    text = []
    for cmd in (['nvidia-smi'], ['nvidia-smi', '--query-gpu=name,memory.total,driver_version',
                                 '--format=csv,noheader']):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
        text.append(f'$ {" ".join(cmd)}\n{r.stdout}{r.stderr}')
        S.data.setdefault('rc', []).append(r.returncode)
    (out / 'nvidia-smi.txt').write_text('\n'.join(text))
    S.data['query'] = r.stdout.strip()
    props = torch.cuda.get_device_properties(S.device)
    S.data.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1))
    S.data['status'] = 'ok'


def run_cuda_tests(S: Section, out: Path):
    if S.device.type != 'cuda':
        S.data.update(status='skipped', reason='not a CUDA device (the cuda tests need one)')
        return
    if importlib.util.find_spec('pytest') is None:
        S.data.update(status='error', error='pytest is not installed in this environment: '
                      'carry a pytest wheel (and its dependencies) and pip install it first')
        return
    cmd = [sys.executable, '-m', 'pytest', '-m', 'cuda', 'tests/device', 'tests/test_ops.py', '-q',
           '-p', 'no:cacheprovider']
    S.data['command'] = ' '.join(cmd[1:])
    timeout = max(10.0, S.left())
    text, rc = run_command(cmd, timeout)
    (out / 'cuda_tests.txt').write_text(text)
    counts = {k: int(v) for v, k in re.findall(
        r'(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)', text[-3000:])}
    S.data.update(rc=rc, counts=counts, tail=text[-1500:],
                  failures=re.findall(r'^FAILED .*$|^ERROR .*$', text, re.M)[:40])
    S.data['status'] = 'ok' if rc == 0 else ('timeout' if rc is None else 'failed')


def run_gps_step(S: Section, out: Path):
    quick = S.quick
    work = [('molecule', 'Peptides-like: 128 graphs of 120-180 nodes', (128, 120, 180, 0)),
            ('tu', 'TU-sized: 128 graphs of 20-40 nodes', (128, 20, 40, 1))]
    if quick:
        work = [('molecule', 'quick: 4 graphs of 120-180 nodes', (4, 120, 180, 0)),
                ('tu', 'quick: 8 graphs of 20-40 nodes', (8, 20, 40, 1))]
    repeats, warmup = (2, 0) if quick else (10, 2)  # quick: the first round warms up
    cols = (MHA, PERF, GRF, GRF_LOADER)
    S.data.update(columns=list(cols), walks=GPS_WALKS, repeats=repeats, warmup=warmup,
                  model='node/edge Linear encoders, 2 x block(GINEConv, 64 channels, 4 heads, '
                        'batch norm), mean pool, Linear; BCE on 10 labels; Adam')
    cases = [(w, bf16) for w in work for bf16 in (False, True)]
    for i, ((name, desc, args), bf16) in enumerate(cases):
        if i and S.left() < 5:
            S.data.setdefault('skipped', []).append(f'{name} {"bf16" if bf16 else "fp32"}: '
                                                    f'time budget')
            continue
        if not bf16:
            t = time.perf_counter()
            b = molecule_batch(*args, device=S.device)
            S.data.setdefault('workloads', {})[name] = dict(
                desc=desc, num_nodes=b.num_nodes, num_graphs=b.num_graphs,
                num_edges=b.edge_index.size(1), grf_entries=b.grf_index.size(1),
                build_s=time.perf_counter() - t)
        dtype = 'bf16 autocast' if bf16 else 'fp32'
        # time left shared among the remaining cases
        deadline = time.time() + S.left() / (len(cases) - i)
        S.data['current'] = f'{name}, {dtype}'  # named by a kill at the time limit
        S.save()
        steps = {c: gps_step(c, b, S.device, bf16) for c in cols}
        r = round_robin(steps, S.device, repeats, warmup, deadline)
        for c in cols:
            row = {'workload': name, 'dtype': dtype, 'column': c}
            if c in r['times']:
                med, q1, q3 = quartiles(r['times'][c])
                row.update(ms=1e3 * med, ms_q1=1e3 * q1, ms_q3=1e3 * q3,
                           rounds=len(r['times'][c]),
                           ratio_vs_multihead=round_ratio(r['times'], c, MHA),
                           ratio_vs_performer=round_ratio(r['times'], c, PERF))
            else:
                row['error'] = r['errors'].get(c, 'not run')
            S.add(row)
        del steps
        free(S.device)
    S.data['status'] = 'ok'


def fwd_bwd(call, x: torch.Tensor):
    def run():
        x.grad = None
        call(x).float().sum().backward()
    return run


def run_knn(S: Section, out: Path):
    sides = (8, 16) if S.quick else KNN_SIDES
    repeats = 2 if S.quick else 3
    dev = S.device
    S.data.update(sides=list(sides), k=8, heads=H, head_channels=C // H, walks=KNN_WALKS,
                  repeats=repeats, largest_fit={}, stopped={})
    alive = {'performer': True, 'linear': True, 'grf': True}
    last_size_s = None
    for side in sides:
        n = side * side
        if last_size_s is not None and S.left() < 4.5 * last_size_s:  # the next is 4x larger
            S.data.setdefault('skipped', []).append(f'{n} nodes: time budget '
                                                    f'({S.left():.0f} s left)')
            break
        if not any(alive.values()):
            break
        t_size = time.perf_counter()
        try:
            data = knn_graph(side, dev)
        except Exception as exc:
            S.data['stopped']['graph'] = f'{n} nodes: {error_text(exc)}'
            break
        size = {'nodes': n, 'edges': data.edge_index.size(1)}
        times = {}
        for method in ('performer', 'linear', 'grf'):
            if not alive[method]:
                continue
            row = dict(size, method=method)
            S.data['current'] = f'{n} nodes, {method}'  # named by a kill at the time limit
            S.save()
            try:
                torch.manual_seed(0)
                x = torch.randn(n, C, device=dev, requires_grad=True)
                if method == 'performer':
                    attn = PerformerAttention(C, heads=H, head_channels=C // H).to(dev)
                    call = lambda x, attn=attn: attn(x.unsqueeze(0)).squeeze(0)  # noqa: E731
                elif method == 'linear':
                    attn = attention_resolver('linear', C, heads=H).to(dev)
                    call = lambda x, attn=attn: attn(x, None)  # noqa: E731
                else:
                    attn = GRFAttention(C, heads=H, max_length=MAX_LENGTH).to(dev)
                    walked = {}  # the walks, on the device (not timed with the layer)
                    row['walks_s'] = timed(lambda: walked.update(
                        data=AddGraphRandomFeatures(**KNN_WALKS)(data)), dev)
                    row['grf_entries'] = walked['data'].grf_index.size(1)
                    payload = {}  # full-graph training: one payload for every step
                    row['payload_s'] = timed(
                        lambda: payload.update(attn.payload(walked['data'])), dev)
                    row['backend'] = ','.join(sorted({p.backend for p in
                                                      payload['grf'].parts.values()}))
                    call = lambda x, attn=attn: attn(x, None, **payload)  # noqa: E731
                run = fwd_bwd(call, x)
                with peak_memory(dev, row):  # the first call (the plan is built: payload_s)
                    row['first_ms'] = 1e3 * timed(run, dev)
                ts = [timed(run, dev) for _ in range(repeats)]
                times[method] = ts
                row['ms'] = 1e3 * statistics.median(ts)
                S.data['largest_fit'][method] = n
            except Exception as exc:
                kind = 'oom' if is_oom(exc) else 'error'
                row.update(error=error_text(exc), failure=kind)
                alive[method] = False
                S.data['stopped'][method] = f'{n} nodes: {kind}'
            finally:
                attn = call = run = x = payload = walked = None
                free(dev)
            S.add(row)
        for row in S.data['rows']:  # ratios at this size, beside the baseline
            if row['nodes'] == n and 'ms' in row:
                for base in ('performer', 'linear'):
                    if base in times and row['method'] in times:
                        row[f'ratio_vs_{base}'] = (statistics.median(times[row['method']]) /
                                                   statistics.median(times[base]))
        S.save()
        data = None
        free(dev)
        last_size_s = time.perf_counter() - t_size
    S.data['status'] = 'ok'


def run_gkat(S: Section, out: Path):
    dev = S.device
    t = time.perf_counter()
    data = pubmed_like(dev, S.quick)
    f = data.x.size(1)
    S.data.update(num_nodes=data.num_nodes, num_edges=data.edge_index.size(1), in_channels=f,
                  rwgnk=RWGNK_WALKS, build_s=time.perf_counter() - t,
                  rwgnk_kernel_pairs=(data.rwgnk_kernel_index.size(1)
                                      if getattr(data, 'rwgnk_kernel_index', None) is not None
                                      else None))
    repeats = 2 if S.quick else 10
    torch.manual_seed(0)
    x = data.x.clone().requires_grad_()
    gat = GATConv(f, 8, heads=8).to(dev)
    layers = {'GATConv 8x8': (gat, lambda x: gat(x, data.edge_index))}
    for mode in ('softmax', 'linear'):  # the paper's GAT-shaped layer, and its O(N) mode
        g = GKATAttention(f, heads=8, head_channels=8, mode=mode, project=False).to(dev)
        payload = g.payload(data)  # full-graph training: built once, before the steps
        layers[f'GKAT {mode} 8x8'] = (g, lambda x, g=g, p=payload: g(x, None, **p))
    rows = {}
    for name, (layer, call) in layers.items():
        row = {'layer': name}
        try:
            run = fwd_bwd(call, x)
            with peak_memory(dev, row):
                row['first_ms'] = 1e3 * timed(run, dev)
            rows[name] = (row, [timed(run, dev) for _ in range(repeats)])
            row['ms'] = 1e3 * statistics.median(rows[name][1])
        except Exception as exc:
            row.update(error=error_text(exc), failure='oom' if is_oom(exc) else 'error')
        S.add(row)
    base = rows.get('GATConv 8x8')
    for name, (row, ts) in rows.items():
        if base is not None:
            row['ratio_vs_gat'] = statistics.median(ts) / statistics.median(base[1])
    S.save()
    S.data['status'] = 'ok'


def count_syncs(fn, device: torch.device) -> dict:
    r"""Runs ``fn`` under ``torch.cuda.set_sync_debug_mode('warn')`` and returns the number of
    synchronising CUDA calls it made with the code lines that made them (each such call
    warns; warnings raised in the backward are replayed in the calling thread)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        if device.type == 'cuda':
            sync(device)
            torch.cuda.set_sync_debug_mode('warn')
        try:
            fn()
        finally:
            if device.type == 'cuda':
                torch.cuda.set_sync_debug_mode('default')
                sync(device)
    hits = [w for w in caught if 'synchroniz' in str(w.message)]
    where = {}
    for w in hits:
        key = f'{os.path.relpath(w.filename, ROOT)}:{w.lineno}'
        where[key] = where.get(key, 0) + 1
    return {'count': len(hits), 'where': dict(sorted(where.items(), key=lambda kv: -kv[1]))}


def run_sync(S: Section, out: Path):
    dev = S.device
    if dev.type != 'cuda':
        S.data['note'] = ('no CUDA device: set_sync_debug_mode is not active, every count is 0; '
                          'the calls run the same code')
    b = molecule_batch(*((4, 120, 180, 0) if S.quick else (128, 120, 180, 0)), device=dev,
                       rwgnk=True)
    S.data['workloads'] = {'molecule': f'{b.num_graphs} graphs, {b.num_nodes} nodes'}
    try:
        big = AddGraphRandomFeatures(**KNN_WALKS)(knn_graph(8 if S.quick else 256, dev))
        S.data['workloads']['knn'] = f'one kNN graph of {big.num_nodes} nodes'
    except Exception as exc:  # the molecule rows still run
        big, S.data['workloads']['knn'] = None, error_text(exc)
    torch.manual_seed(0)
    layers = [('GRFAttention auto', 'molecule', GRFAttention(C, heads=H, max_length=MAX_LENGTH))]
    for backend in ('sparse', 'pairs'):
        layers.append((f'GRFAttention {backend}', 'molecule',
                       GRFAttention(C, heads=H, max_length=MAX_LENGTH, backend=backend)))
    layers += [
        ('GRFAttention auto', 'knn', GRFAttention(C, heads=H, max_length=MAX_LENGTH)),
        ('GRFAttention global_beta=0.1', 'molecule',
         GRFAttention(C, heads=H, max_length=MAX_LENGTH, global_beta=0.1)),
        ('GKATAttention linear', 'molecule', GKATAttention(C, heads=H)),
        ('GKATAttention softmax', 'molecule', GKATAttention(C, heads=H, mode='softmax')),
        ('linear (registry)', 'molecule', attention_resolver('linear', C, heads=H)),
        ('GRFGPSConv grf block', 'molecule', gps_block(GRF)),
    ]
    for name, where, layer in layers:
        if S.left() < 2:
            S.data.setdefault('skipped', []).append(f'{name} on {where}: time budget')
            continue
        row = {'layer': name, 'workload': where}
        try:
            if where == 'knn' and big is None:
                raise RuntimeError(f"no kNN graph: {S.data['workloads']['knn']}")
            data = fresh(b) if where == 'molecule' else big
            layer = layer.to(dev).train()
            x = torch.randn(data.num_nodes, C, device=dev, requires_grad=True)
            e = torch.randn(data.edge_index.size(1), C, device=dev) if where == 'molecule' \
                else None
            batch = getattr(data, 'batch', None)
            payload = layer.payload(data)  # the batch's payload (its plan), built before counting
            for call in ('first', 'second'):  # both after the plan: the first call, and later
                holder = {}

                def forward():
                    if isinstance(layer, GRFGPSConv):
                        holder['out'] = layer(x, data.edge_index, batch, **payload, edge_attr=e)
                    else:
                        holder['out'] = layer(x, batch, **payload)

                def backward():
                    holder['out'].float().sum().backward()
                row[f'{call}_forward'] = count_syncs(forward, dev)
                row[f'{call}_backward'] = count_syncs(backward, dev)
                row[f'{call}_total'] = (row[f'{call}_forward']['count'] +
                                        row[f'{call}_backward']['count'])
        except Exception as exc:
            row['error'] = error_text(exc)
            row['traceback'] = traceback.format_exc()[-2000:]
        S.add(row)
    S.data['status'] = 'ok'




def run_section(name: str, out: Path, device: torch.device, quick: bool, deadline: float):
    r"""Runs one section in this process; an exception is recorded, not raised."""
    S = Section(out, name, device, quick, deadline)
    S.save()
    t = time.perf_counter()
    try:
        RUNNERS[name](S, out)
    except Exception as exc:
        S.data.update(status='error', error=error_text(exc),
                      traceback=traceback.format_exc()[-4000:])
    S.data['seconds'] = time.perf_counter() - t
    S.data.pop('current', None)
    S.save()


def top_ops(fn, device: torch.device, calls: int = 3, top: int = 10) -> dict:
    r"""``fn`` once unprofiled, then ``calls`` times under ``torch.profiler``: the wall time per
    call and the ``top`` operators by self time on ``device`` (the CPU when it is one)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        sync(device)
    wall = (time.perf_counter() - t) / calls
    key = 'self_device_time_total' if device.type == 'cuda' else 'self_cpu_time_total'
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events) or 1.0
    ops = [{'op': e.key[:80], 'calls': e.count // calls, 'ms': getattr(e, key) / 1e3 / calls,
            'share': getattr(e, key) / total} for e in events[:top]]
    res = {'wall_ms': 1e3 * wall, 'device_ms': total / 1e3 / calls, 'ops': ops}
    if device.type == 'cuda':  # where the host's time goes (launches, plan building)
        host = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        res['host_ops'] = [{'op': e.key[:80], 'calls': e.count // calls,
                            'ms': e.self_cpu_time_total / 1e3 / calls} for e in host[:top]]
    return res


def run_profile(S: Section, out: Path):
    dev = S.device
    side = 16 if S.quick else 512
    data = AddGraphRandomFeatures(**KNN_WALKS)(knn_graph(side, dev))
    S.data.update(nodes=side * side, calls=3)
    for backend in ('auto', 'sparse', 'pairs'):
        if S.left() < 10:
            S.data.setdefault('skipped', []).append(f'knn {backend}: time budget')
            continue
        row = {'workload': f'knn {side * side:,} nodes', 'what': f'GRFAttention {backend!r}'}
        try:
            torch.manual_seed(0)
            attn = GRFAttention(C, heads=H, max_length=MAX_LENGTH, backend=backend).to(dev)
            payload = attn.payload(data)
            row['backend'] = ','.join(sorted({p.backend for p in payload['grf'].parts.values()}))
            x = torch.randn(side * side, C, device=dev, requires_grad=True)
            row.update(top_ops(fwd_bwd(lambda x: attn(x, None, **payload), x), dev))
        except Exception as exc:
            row['error'] = error_text(exc)
        finally:
            attn = payload = x = None
            free(dev)
        S.add(row)
    data = None
    if S.left() > 10:
        b = molecule_batch(*((4, 120, 180, 0) if S.quick else (128, 120, 180, 0)), device=dev)
        for column in (MHA, GRF):
            row = {'workload': 'molecule batch', 'what': f'training step {column}'}
            try:
                row.update(top_ops(gps_step(column, b, dev, False), dev))
            except Exception as exc:
                row['error'] = error_text(exc)
            S.add(row)
    S.data['status'] = 'ok'


def run_backends(S: Section, out: Path):
    from pyg_grf.memory import memory_budget
    dev = S.device
    sides = (16, 32) if S.quick else (512, 1024)
    budget, source = memory_budget(dev)
    S.data.update(walks=KNN_WALKS, power_law_walks=NODE_WALKS, heads=H, head_channels=C // H,
                  budget_bytes=budget, budget_source=source, rule={})
    graphs = [('knn', lambda side=side: AddGraphRandomFeatures(**KNN_WALKS)(
        knn_graph(side, dev))) for side in sides]
    graphs.append(('power-law', lambda: power_law(dev, S.quick)))
    for graph, make in graphs:
        if S.left() < 15:
            S.data.setdefault('skipped', []).append(f'{graph}: time budget')
            break
        data = make()
        n = data.num_nodes
        size = {'graph': graph, 'nodes': n, 'edges': data.edge_index.size(1),
                'grf_entries': data.grf_index.size(1)}
        ms, picks = {}, None
        for backend in ('pairs', 'sparse', 'auto'):  # 'auto': which one the rule picks
            row = dict(size, backend=backend)
            S.data['current'] = f'{n} nodes, {backend}'
            S.save()
            try:
                torch.manual_seed(0)
                attn = GRFAttention(C, heads=H, max_length=MAX_LENGTH, backend=backend).to(dev)
                plan, stats = {}, {}
                with peak_memory(dev, stats):
                    row['plan_s'] = timed(
                        lambda: plan.update(grf=GRFPlan.build(data, [attn])), dev)
                row['plan_peak_bytes'] = stats['peak_bytes']
                parts = list(plan['grf'].parts.values())
                row['runs'] = [p.backend for p in parts]
                row['plan_bytes'] = sum(plan['grf'].nbytes().values())
                if row['runs'] == ['pairs']:
                    row['mask_cells'] = parts[0].structures.nnz
                if backend == 'auto':
                    picks = row['runs']
                else:  # the layer: forward + backward
                    x = torch.randn(n, C, device=dev, requires_grad=True)
                    run = fwd_bwd(lambda x: attn(x, None, **plan), x)
                    with peak_memory(dev, stats):
                        row['first_ms'] = 1e3 * timed(run, dev)
                    row['call_peak_bytes'] = stats['peak_bytes']
                    row['ms'] = 1e3 * statistics.median(timed(run, dev) for _ in range(3))
                    ms[backend] = row['ms']
            except Exception as exc:
                row.update(error=error_text(exc), failure='oom' if is_oom(exc) else 'error')
            finally:
                attn = plan = parts = x = run = None
                free(dev)
            S.add(row)
        rule = {'auto_picks': picks, 'faster': min(ms, key=ms.get) if ms else None,
                'pairs_over_sparse': (ms['pairs'] / ms['sparse'] if len(ms) == 2 else None)}
        rule['auto_picks_faster'] = (None if picks is None or rule['faster'] is None
                                     else picks == [rule['faster']])
        S.data['rule'][f'{graph} {n}'] = rule
        S.save()
        data = None
        free(dev)
    S.data['status'] = 'ok'


def run_op_count(S: Section, out: Path):
    graphs = ['--graphs', '4'] if S.quick else ['--graphs', '128', '--compile']
    cmd = [sys.executable, 'bench/op_count.py', *graphs, '--out', str(out / 'op_count')]
    S.data['command'] = 'python ' + ' '.join(cmd[1:])
    timeout = max(10.0, S.left() - 2)
    text, rc = run_command(cmd, timeout)
    (out / 'op_count.txt').write_text(text)
    S.data.update(rc=rc, tail=text[-1500:])
    result = out / 'op_count.json'
    if rc != 0 or not result.exists():
        S.data.update(status='timeout' if rc is None else 'failed',
                      error=f'{S.data["command"]}: ' + ('killed after %.0f s' % timeout
                                                         if rc is None else f'exit code {rc}'))
        return
    R = json.loads(result.read_text())
    S.data.update(workload=R.get('workload'), compile=R.get('compile'))
    for row in R['rows']:
        S.add(row)
    S.data['status'] = 'ok'


def edge_sums(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
              wsrc: torch.Tensor, row: torch.Tensor, col: torch.Tensor, crow: torch.Tensor,
              reduce: str) -> torch.Tensor:
    r"""The engine's pair kernel (:func:`pyg_grf.nn.attention.grf.pairs.pair_sums`:
    :math:`o_i = \sum_j w_{ij} \langle q_i, k_j \rangle v_j` over the cells ``(row, col)``,
    ``w_ij = w[wsrc]``) written as gathers and one scatter, differentiated by autograd, in the
    operands' dtype: ``'index_add'`` sums the messages with atomics, ``'segment'`` with
    ``torch.segment_reduce`` over the CSR row offsets (the cells are row-major)."""
    s = (q.index_select(0, row) * k.index_select(0, col)).sum(-1) * w.index_select(0, wsrc)
    msg = s.to(v.dtype).unsqueeze(-1) * v.index_select(0, col)
    if reduce == 'index_add':
        return msg.new_zeros(q.size(0), v.size(1)).index_add_(0, row, msg)
    return torch.segment_reduce(msg, 'sum', offsets=crow, axis=0)


def run_pair_kernel(S: Section, out: Path):
    r"""The engine's pair kernel (``torch.sparse.sampled_addmm`` + CSR products: cuSPARSE on a
    GPU) against the same sums by gathers and a scatter (:func:`edge_sums`), forward + backward
    of every head in one call, on the plan of the GPS molecule batch and of a kNN graph: whether
    a gather formulation would be the cheaper kernel on this device (the GPS step's remaining
    gap is the sparse kernels' device time, ``gpu_notes.md``). Outputs and gradients are
    compared with the engine's."""
    from pyg_grf.nn.attention.grf import pairs
    dev = S.device
    m = C // H
    cases = [('molecule', lambda: molecule_batch(*((4, 120, 180, 0) if S.quick
                                                   else (128, 120, 180, 0)), device=dev)),
             ('knn', lambda: AddGraphRandomFeatures(**KNN_WALKS)(
                 knn_graph(16 if S.quick else 256, dev)))]
    repeats = 3 if S.quick else 20
    S.data.update(heads=H, head_channels=m, repeats=repeats)
    for workload, make in cases:
        if S.left() < 10:
            S.data.setdefault('skipped', []).append(f'{workload}: time budget')
            continue
        data = make()
        torch.manual_seed(0)
        attn = GRFAttention(C, heads=H, max_length=MAX_LENGTH).to(dev)
        part = next(iter(GRFPlan.build(data, [attn]).parts.values()))
        size = {'workload': workload, 'nodes': data.num_nodes}
        if part.backend != 'pairs':
            S.add(dict(size, error=f"the plan runs {part.backend!r}, not the engine"))
            continue
        st = part.structures
        idx = st.expand(H)
        R = H * st.num_nodes
        crow, col, wsrc = idx.crow.long(), idx.col.long(), idx.wsrc.long()
        row = torch.repeat_interleave(torch.arange(R, device=dev), crow.diff())
        w0 = st.values(attn.coefficients().detach()).reshape(-1)
        size['cells'] = col.numel()
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device=dev).manual_seed(0)
            q, k = (torch.rand(R, m, device=dev, generator=g).to(dtype).requires_grad_()
                    for _ in range(2))
            v = torch.randn(R, m + 1, device=dev, generator=g).to(dtype).requires_grad_()
            w = w0.clone().requires_grad_()
            calls = {'engine': lambda: pairs.pair_sums(
                q, k, v, w, idx.wsrc, idx.crow, idx.col, idx.tcrow, idx.tcol, idx.tperm,
                True, 1)[0]}
            for reduce in ('index_add', 'segment'):
                calls[f'gather + {reduce}'] = lambda r=reduce: edge_sums(q, k, v, w, wsrc, row,
                                                                          col, crow, r)
            ref = None
            rows = {}
            for name, call in calls.items():
                row_ = dict(size, dtype=str(dtype).split('.')[-1], kernel=name)
                try:  # agreement with the engine (float32 accumulation there)
                    o = call()  # every kernel gets the engine's output gradient
                    grad = (ref[2] if ref is not None
                            else torch.randn(o.shape, device=dev, generator=g).to(o.dtype))
                    gs = torch.autograd.grad(o, (q, k, v, w), grad)
                    if ref is None:
                        ref = (o.float(), [x.float() for x in gs], grad)
                    else:
                        scale = max(ref[0].abs().max().item(), 1e-30)
                        row_['max_rel_diff_out'] = (o.float() - ref[0]).abs().max().item() / scale
                        row_['max_rel_diff_grads'] = max(
                            (a.float() - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
                            for a, b in zip(gs, ref[1]))
                    rows[name] = row_
                except Exception as exc:
                    row_.update(error=error_text(exc), failure='oom' if is_oom(exc) else 'error')
                    S.add(row_)
            timing = round_robin({n: (lambda c=calls[n]: c().float().sum().backward())
                                  for n in rows}, dev, repeats, 1, time.time() + S.left() / 2)
            ts = timing['times']
            for name, row_ in rows.items():
                if name in ts:
                    row_['ms'] = 1e3 * statistics.median(ts[name])
                    row_['ratio_vs_engine'] = round_ratio(ts, name, 'engine')
                if name in timing['errors']:
                    row_['error'] = timing['errors'][name]
                S.add(row_)
            q = k = v = w = None
            free(dev)
        data = part = st = idx = None
        free(dev)
    S.data['status'] = 'ok'


RUNNERS = {'nvidia_smi': run_nvidia_smi, 'cuda_tests': run_cuda_tests, 'gps_step': run_gps_step,
           'knn': run_knn, 'gkat': run_gkat, 'sync': run_sync, 'profile': run_profile,
           'backends': run_backends, 'op_count': run_op_count, 'pair_kernel': run_pair_kernel}


# Summary ##########################################################################################


def environment(device: torch.device) -> dict:
    r"""The versions and the machine; the GPU's name and memory come from the ``nvidia_smi``
    section (this driver process creates no CUDA context: the sections' processes get the
    whole device)."""
    env = {'python': platform.python_version(), 'torch': torch.__version__,
           'torch_cuda': torch.version.cuda, 'torch_geometric': torch_geometric.__version__,
           'device': str(device), 'machine': f'{platform.machine()}, {os.cpu_count()} CPU cores'}
    try:
        env['commit'] = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT,
                                       capture_output=True, text=True,
                                       timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env['commit'] = None
    return env


def fmt(v, spec='.1f', none='—'):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return none
    return format(v, spec)


def mib(v):
    return fmt(None if v is None else v / 2 ** 20, '.0f', 'n/a')


def to_markdown(R: dict) -> str:
    env = R['environment']
    lines = ['# GPU check', '',
             f"`{R['command']}`: {env.get('gpu', env['device'])}"
             f"{', %s GiB' % env['gpu_memory_gib'] if 'gpu_memory_gib' in env else ''}; "
             f"torch {env['torch']} (CUDA {env['torch_cuda']}), torch-geometric "
             f"{env['torch_geometric']}, Python {env['python']}, commit {env.get('commit')}"
             f"{'; quick sizes' if R['quick'] else ''}; {R.get('seconds', 0):.0f} s in all.", '',
             '| section | status | seconds |', '|---|---|---|']
    for name in R['sections_run']:
        s = R['sections'].get(name, {})
        extra = f" ({s.get('error') or s.get('reason') or ''})" if s.get('status') != 'ok' else ''
        lines.append(f"| {name} | {s.get('status', '?')}{extra} | {fmt(s.get('seconds'), '.0f')} |")
    lines.append('')
    S = R['sections']
    if S.get('nvidia_smi', {}).get('query'):
        lines += ['## nvidia-smi', '', f"`{S['nvidia_smi']['query']}` (full output in "
                  f"`nvidia-smi.txt`)", '']
    t = S.get('cuda_tests', {})
    if t.get('status') not in (None, 'skipped'):
        lines += ['## CUDA tests', '', f"`{t.get('command')}`: rc {t.get('rc')}, "
                  f"{t.get('counts')} (output in `cuda_tests.txt`)", '']
        lines += [f'- `{f}`' for f in t.get('failures', [])] + ['']
    g = S.get('gps_step', {})
    if g.get('rows'):
        lines += ['## Whole GPS training step', '', g.get('model', '') + '. A fresh batch object '
                  f'every step: `{GRF}` builds the batch\'s plan inside the step (as for a batch '
                  f'never seen before), `{GRF_LOADER}` finds it on the batch (`grf_plan`, built '
                  'by `pyg_grf.loader.prepare_payload` before the timed steps, as '
                  '`pyg_grf.loader.DataLoader` does in its workers); columns timed round-robin; '
                  'ratio = median over rounds of the per-round ratio.', '']
        for name, w in g.get('workloads', {}).items():
            lines.append(f"- `{name}`: {w['desc']}; {w['num_nodes']} nodes, {w['num_edges']} "
                         f"edges, {w['grf_entries']} GRF entries")
        lines += ['', '| workload | dtype | column | ms / step | / GPS multihead | '
                  '/ GPS performer 4x16 |', '|---|---|---|---|---|---|']
        for r in g['rows']:
            lines.append(f"| {r['workload']} | {r['dtype']} | {r['column']} | "
                         f"{fmt(r.get('ms'), '.2f', r.get('error', '—'))} | "
                         f"{fmt(r.get('ratio_vs_multihead'), '.2f')} | "
                         f"{fmt(r.get('ratio_vs_performer'), '.2f')} |")
        lines.append('')
    k = S.get('knn', {})
    if k.get('rows'):
        lines += ['## One attention layer on kNN graphs (forward + backward)', '',
                  f"k = 8, {H} heads x {C // H} channels; GRF walks {k.get('walks')}; "
                  "`payload s`: GRF's plan (`attn.payload`, built once before the calls, as in "
                  "full-graph training); `first ms` is the first call, `ms` the median of "
                  "later calls; memory = `torch.cuda.max_memory_allocated` over the first call "
                  "(graph, input and payload included).", '',
                  '| nodes | method | ms | first ms | peak MiB | / performer | / linear | '
                  'walks s | payload s |', '|---|---|---|---|---|---|---|---|---|']
        for r in k['rows']:
            lines.append(f"| {r['nodes']:,} | {r['method']}"
                         f"{' (' + r['backend'] + ')' if r.get('backend') else ''} | "
                         f"{fmt(r.get('ms'), '.2f', r.get('error', '—'))} | "
                         f"{fmt(r.get('first_ms'), '.2f')} | {mib(r.get('peak_bytes'))} | "
                         f"{fmt(r.get('ratio_vs_performer'), '.2f')} | "
                         f"{fmt(r.get('ratio_vs_linear'), '.2f')} | "
                         f"{fmt(r.get('walks_s'), '.2f')} | {fmt(r.get('payload_s'), '.2f')} |")
        lines += ['', f"Largest size that ran: {k.get('largest_fit')}; stopped: "
                      f"{k.get('stopped') or 'none'}; {k.get('skipped') or ''}", '']
    gk = S.get('gkat', {})
    if gk.get('rows'):
        lines += ['## GKAT against GATConv (PubMed-sized random graph)', '',
                  f"{gk['num_nodes']} nodes, {gk['num_edges']} edges, {gk['in_channels']} "
                  f"features; RWGNK {gk['rwgnk']}, {gk.get('rwgnk_kernel_pairs')} kernel pairs; "
                  "one layer forward + backward, payload built once.", '',
                  '| layer | ms | first ms | peak MiB | / GATConv |', '|---|---|---|---|---|']
        for r in gk['rows']:
            lines.append(f"| {r['layer']} | {fmt(r.get('ms'), '.2f', r.get('error', '—'))} | "
                         f"{fmt(r.get('first_ms'), '.2f')} | {mib(r.get('peak_bytes'))} | "
                         f"{fmt(r.get('ratio_vs_gat'), '.2f')} |")
        lines.append('')
    sy = S.get('sync', {})
    if sy.get('rows'):
        lines += ['## Host synchronisations inside one layer', '',
                  "`torch.cuda.set_sync_debug_mode('warn')`, counted after the payload (the "
                  "batch's plan) is built: the first call and the second call. "
                  f"{sy.get('note', '')}", '',
                  '| layer | workload | first fwd | first bwd | second fwd | second bwd | '
                  'where (second call) |', '|---|---|---|---|---|---|---|']
        for r in sy['rows']:
            if 'error' in r:
                lines.append(f"| {r['layer']} | {r['workload']} | {r['error']} | | | | |")
                continue
            where = dict(r['second_forward']['where'])
            for k, v in r['second_backward']['where'].items():
                where[k] = where.get(k, 0) + v
            lines.append(f"| {r['layer']} | {r['workload']} | {r['first_forward']['count']} | "
                         f"{r['first_backward']['count']} | {r['second_forward']['count']} | "
                         f"{r['second_backward']['count']} | "
                         f"{', '.join(f'`{k}` x{v}' for k, v in list(where.items())[:4])} |")
        lines.append('')
    be = S.get('backends', {})
    if be.get('rows'):
        budget = be.get('budget_bytes')
        limit = ('no limit' if budget is None else
                 f"{budget / 2 ** 30:.1f} GiB ({be.get('budget_source')})")
        lines += ["## GRF backends: the engine ('pairs') against the low-rank path "
                  "('sparse'), and what 'auto' picks (kNN and power-law graphs)", '',
                  "`backend='auto'` runs 'pairs' when its join and one layer fit the memory "
                  f"budget, here {limit}, and it counts no more multiply-adds than 'sparse', "
                  "else 'sparse'. `plan s`: `GRFPlan.build` (for "
                  "'pairs' the join); `runs`: `[p.backend for p in plan.parts.values()]`; "
                  "`ms`: one layer's forward + backward, median of 3 calls after the first; "
                  "peaks: `torch.cuda.max_memory_allocated` over the plan's build and over the "
                  "first call.", '',
                  '| graph | nodes | backend | runs | plan s | plan MiB | mask cells | ms | '
                  'first ms | plan peak MiB | call peak MiB |',
                  '|---|---|---|---|---|---|---|---|---|---|---|']
        for r in be['rows']:
            plan_s = fmt(r.get('plan_s'), '.3f', r.get('error', '—'))
            lines.append(f"| {r.get('graph', 'knn')} | {r['nodes']:,} | {r['backend']} | "
                         f"{','.join(r.get('runs', []))} | "
                         f"{plan_s} | {mib(r.get('plan_bytes'))} | {r.get('mask_cells', '—')} | "
                         f"{fmt(r.get('ms'), '.2f')} | {fmt(r.get('first_ms'), '.2f')} | "
                         f"{mib(r.get('plan_peak_bytes'))} | {mib(r.get('call_peak_bytes'))} |")
        lines.append('')
        for n, rule in be.get('rule', {}).items():
            picks = ','.join(rule.get('auto_picks') or []) or '—'
            lines.append(f"- {n} nodes: 'auto' picks `{picks}`; faster: "
                         f"`{rule.get('faster') or '—'}` (pairs / sparse = "
                         f"{fmt(rule.get('pairs_over_sparse'), '.2f')})")
        lines.append('')
    oc = S.get('op_count', {})
    if oc.get('status') not in (None, 'skipped'):
        lines += ['## Operators per training step (`bench/op_count.py`, on the CPU)', '',
                  f"`{oc.get('command')}`: {oc.get('workload') or oc.get('error', '')} "
                  "(output in `op_count.txt`, `op_count.md`)", '']
        if oc.get('rows'):
            lines += ['| step | operators dispatched | ratio | expanded (custom ops opened) | '
                      'ratio |', '|---|---|---|---|---|']
            lines += [f"| {r['column']} | {r['dispatched']} | {r['ratio_dispatched']:.2f}x | "
                      f"{r['expanded']} | {r['ratio_expanded']:.2f}x |" for r in oc['rows']]
            lines.append('')
        comp = oc.get('compile') or {}
        if comp:
            ex, dyn = comp.get('explain', {}), comp.get('dynamic', {})
            lines += [f"`torch._dynamo.explain`: {ex.get('graphs')} graphs, "
                      f"{ex.get('graph_breaks')} graph breaks, in pyg_grf: "
                      f"{ex.get('breaks_in_pyg_grf') or 'none'}; `torch.compile(dynamic=True)` "
                      f"over batches of {dyn.get('batches')} nodes: "
                      f"{dyn.get('new_graphs_after_first')} graphs compiled after the first.",
                      '']
    pk = S.get('pair_kernel', {})
    if pk.get('rows'):
        lines += ['## The pair kernel: the engine against gathers and a scatter', '',
                  f"`pairs.pair_sums` (sampled product + CSR products) against `edge_sums` "
                  f"(gathers, then `index_add_` or `segment_reduce`), {pk.get('heads')} heads x "
                  f"{pk.get('head_channels')}, every head in one call, forward + backward, "
                  f"median of {pk.get('repeats')} interleaved calls; diffs relative to the "
                  "engine's largest value.", '',
                  '| workload | nodes | cells (all heads) | dtype | kernel | ms | / engine | '
                  'diff out | diff grads |', '|---|---|---|---|---|---|---|---|---|']
        for r in pk['rows']:
            lines.append(f"| {r['workload']} | {r['nodes']} | {r.get('cells', '—')} | "
                         f"{r.get('dtype', '—')} | {r.get('kernel', '—')} | "
                         f"{fmt(r.get('ms'), '.2f', r.get('error', '—'))} | "
                         f"{fmt(r.get('ratio_vs_engine'), '.2f')} | "
                         f"{fmt(r.get('max_rel_diff_out'), '.1e')} | "
                         f"{fmt(r.get('max_rel_diff_grads'), '.1e')} |")
        lines.append('')
    pr = S.get('profile', {})
    for r in pr.get('rows', []):
        if 'error' in r:
            lines += [f"### {r['workload']}: {r['what']}: {r['error']}", '']
            continue
        if r is pr['rows'][0]:
            lines += ['## Where the device time goes (torch.profiler, self time per call)', '']
        lines += [f"### {r['workload']}: {r['what']}"
                  f"{' (runs ' + r['backend'] + ')' if r.get('backend') else ''}", '',
                  f"{r['wall_ms']:.2f} ms wall per call, {r['device_ms']:.2f} ms of operator self "
                  "time on the device", '', '| operator | calls | ms | share |',
                  '|---|---|---|---|']
        lines += [f"| `{o['op']}` | {o['calls']} | {o['ms']:.2f} | {100 * o['share']:.0f}% |"
                  for o in r['ops']] + ['']
        if r.get('host_ops'):
            lines += ['Host (CPU) self time:', '', '| operator | calls | ms |', '|---|---|---|']
            lines += [f"| `{o['op']}` | {o['calls']} | {o['ms']:.2f} |"
                      for o in r['host_ops']] + ['']
    return '\n'.join(lines)


def write_summary(out: Path, R: dict):
    (out / 'gpu_check.json').write_text(json.dumps(R, indent=1, default=str))
    (out / 'gpu_check.md').write_text(to_markdown(R))


# Driver ###########################################################################################


def run_isolated(name: str, args, out: Path, timeout: float) -> None:
    r"""Runs one section in a child process (``--section``) killed after ``timeout`` seconds;
    what it saved before stays, marked ``timeout`` or ``crashed``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), '--out', str(out), '--device',
           args.device, '--section', name, '--deadline', str(time.time() + timeout - 3)]
    if args.quick:
        cmd.append('--quick')
    log = out / 'logs' / f'{name}.log'
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, 'w') as fh:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 'timeout'
    if rc != 0:
        path = out / 'sections' / f'{name}.json'
        path.parent.mkdir(parents=True, exist_ok=True)  # a child killed before it wrote any
        s = json.loads(path.read_text()) if path.exists() else {'name': name, 'rows': []}
        s['status'] = 'timeout' if rc == 'timeout' else 'crashed'
        where = f" during {s['current']}" if s.get('current') else ''
        s['error'] = (f'killed after {timeout:.0f} s{where}' if rc == 'timeout' else
                      f'exit code {rc}{where}: ' + log.read_text()[-800:])
        path.write_text(json.dumps(s, indent=1, default=str))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', required=True, help='folder for the results (created)')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--quick', action='store_true', help='tiny sizes: the same code paths')
    p.add_argument('--only', default=None, help=f'comma-separated sections of {SECTIONS}')
    p.add_argument('--budget', type=float, default=450.,
                   help='seconds for all sections together (default: 450)')
    p.add_argument('--isolation', choices=('auto', 'process', 'none'), default='auto',
                   help="one process per section ('auto': on CUDA only)")
    p.add_argument('--section', default=None, help=argparse.SUPPRESS)   # a child's section
    p.add_argument('--deadline', type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA device; "
                         f"pass --device cpu (with --quick for the smoke run)")
    if args.section:  # a child process of run_isolated
        run_section(args.section, out, device, args.quick,
                    args.deadline or time.time() + CAPS[args.section])
        return
    names = SECTIONS if args.only is None else tuple(args.only.split(','))
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise SystemExit(f'--only: unknown sections {unknown}; expected some of {SECTIONS}')
    isolate = args.isolation == 'process' or (args.isolation == 'auto' and device.type == 'cuda')
    start = time.time()
    R = {'command': 'python bench/gpu_check.py ' + ' '.join(argv if argv is not None
                                                           else sys.argv[1:]),
         'quick': args.quick, 'environment': environment(device), 'isolation':
         'process' if isolate else 'none', 'sections_run': list(names), 'sections': {}}
    # the chosen sections share the budget in proportion to their caps (a subset, e.g. --only
    # gkat on a loaded CPU, gets the whole budget rather than its share of a full run)
    chosen = sum(CAPS[n] for n in names)
    scale = args.budget / chosen
    for name in names:
        # at least 20 s (a child's imports on a cold machine), within what is left
        cap = min(max(CAPS[name] * scale, 20.0), args.budget - (time.time() - start))
        print(f'[gpu_check] {name}: up to {cap:.0f} s', flush=True)
        if cap < 3:
            R['sections'][name] = {'name': name, 'status': 'skipped', 'rows': [],
                                   'reason': 'time budget spent'}
        else:
            if isolate:
                run_isolated(name, args, out, cap)
            else:
                run_section(name, out, device, args.quick, time.time() + cap)
            R['sections'][name] = json.loads((out / 'sections' / f'{name}.json').read_text())
        s = R['sections'][name]
        if name == 'nvidia_smi' and 'gpu' in s:
            R['environment'].update(gpu=s['gpu'], gpu_memory_gib=s['gpu_memory_gib'])
        print(f"[gpu_check] {name}: {s['status']}{' - ' + s['error'] if s.get('error') else ''}",
              flush=True)
        R['seconds'] = time.time() - start
        write_summary(out, R)
    print(to_markdown(R), flush=True)
    return R


if __name__ == '__main__':
    main()
