r"""Quick sampler throughput check (issue #13, item 7): walker-steps per second of sample_walks on
three graphs. Run: OMP_NUM_THREADS=1 taskset -c 1 python bench/quick_sampler_throughput.py"""
import time, torch
from pyg_grf.walks import sample_walks
torch.manual_seed(0)
def graph(N, deg):
    src = torch.arange(N).repeat_interleave(deg)
    dst = torch.randint(N, (N * deg,))
    return torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
cases = [('N=65536 deg~32 n=16 p=0.1 L=8 iid', graph(65536, 16), 65536, 16, 0.1, 8, 'iid'),
         ('N=65536 deg~32 n=16 p=0.1 L=8 repelling', graph(65536, 16), 65536, 16, 0.1, 8, 'repelling'),
         ('N=262144 deg~8 n=8 p=0.2 L=6 antithetic', graph(262144, 4), 262144, 8, 0.2, 6, 'antithetic')]
for name, ei, N, n, p, L, walker in cases:
    g = torch.Generator().manual_seed(0)
    sample_walks(ei, N, n, p, L, walker=walker, generator=g)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); w = sample_walks(ei, N, n, p, L, walker=walker, generator=g); ts.append(time.perf_counter() - t0)
    steps = w.node.numel()
    print(f'{name}: {min(ts)*1e3:.1f} ms, {steps / min(ts) / 1e6:.1f} M walker-steps/s')
