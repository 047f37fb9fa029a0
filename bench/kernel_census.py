r"""Kernel census of one whole GPS training step on CUDA (``bench/gpu_check.py``'s molecule batch:
128 graphs of 120-180 nodes, 2 GINE blocks, C = 64, H = 4): the device kernels each operator
launches, GRF-GPS with the plan built in the loader against PyG's ``GPSConv`` multihead, fp32 and
bf16 autocast, beside the step's median time (20 steps, each synchronised). On the CPU it runs
4 graphs and counts no kernels (a smoke test of the same code). Usage, from the repository
root::

    python bench/kernel_census.py OUT.json
"""
import collections
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, 'bench')
import gpu_check as G  # noqa: E402


def sync(dev: torch.device):
    if dev.type == 'cuda':
        torch.cuda.synchronize()


def census(column: str, b, dev: torch.device, bf16: bool) -> dict:
    step = G.gps_step(column, b, dev, bf16)
    for _ in range(3):
        step()
    sync(dev)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        step()
        sync(dev)
        times.append(time.perf_counter() - t)
    times.sort()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        sync(dev)
    per_op, per_kernel = collections.Counter(), collections.Counter()
    for event in prof.events():
        kernels = getattr(event, 'kernels', None) or []
        per_op[event.name] += len(kernels)
        for k in kernels:
            per_kernel[k.name[:70]] += 1
    return dict(median_ms=times[len(times) // 2] * 1e3, min_ms=times[0] * 1e3,
                kernels=sum(per_op.values()), per_op=[kv for kv in per_op.most_common(60)
                                                      if kv[1]],
                per_kernel=per_kernel.most_common(40))


def main(out: str):
    dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    b = G.molecule_batch(128 if dev.type == 'cuda' else 4, 120, 180, 0, device=dev)
    res = {}
    for column in (G.MHA, G.GRF_LOADER):
        for bf16 in (False, True):
            key = f"{column} {'bf16' if bf16 else 'fp32'}"
            res[key] = r = census(column, b, dev, bf16)
            print(f"== {key}: median {r['median_ms']:.2f} ms, min {r['min_ms']:.2f} ms, "
                  f"{r['kernels']} kernels\n   {r['per_op'][:45]}")
    with open(out, 'w') as f:
        json.dump(res, f, indent=1)


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else 'kernel_census.json')
