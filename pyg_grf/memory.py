r"""Memory checks before large allocations (walk sampling, the GRF pair join, GKAT's kernel):
the memory available (cgroup limits, ``RLIMIT_AS``, CUDA) and a :class:`WalkMemoryError` that
says what would fit, raised before anything large is allocated."""
from __future__ import annotations

import os
import re
from typing import Optional, Tuple, Union

import torch

MEMORY_LIMIT_ENV = 'PYG_GRF_MEMORY_LIMIT'
CHECK_ABOVE = 256 * 2**20  # estimates below 256 MiB are never checked
CGROUP = '/sys/fs/cgroup'


class WalkMemoryError(MemoryError):
    r"""Raised by :func:`sample_walks` when its estimated peak memory exceeds the memory
    available (or the limit set), before anything large is allocated."""


def estimate_walk_memory(num_starts: int, num_walks: int, max_length: int,
                         p_halt: Optional[float] = None, fixed_length: bool = False,
                         walker: str = 'iid', num_edges: int = 0, num_nodes: int = 0) -> int:
    r"""An estimate (from the sizes alone, no sampling) of the peak bytes :func:`sample_walks`
    allocates: per walker about 90 bytes (start node, length, sort, order, step buffers), per
    expected hop record 72 bytes (node, CSR position, edge id and the temporaries that map them
    back to edge ids and trim walks at sinks), plus the CSR of the graph; measured peaks were
    0.7 to 0.9 times the estimate. The expected number of hops of a walker is
    :math:`\sum_{k=1}^{L}(1 - p_{halt})^k` (``L`` for fixed-length walks)."""
    W = int(num_starts) * int(num_walks)
    L = int(max_length)
    if fixed_length or p_halt is None:
        hops = float(L)
    else:
        q = 1.0 - float(p_halt)
        hops = q * (1.0 - q ** L) / (1.0 - q) if q < 1.0 else float(L)
    per_walker = 90
    if walker == 'antithetic' and not fixed_length and p_halt is not None and p_halt > 0.5:
        per_walker += 9 * L  # per-step uniforms and halting flags
    if walker == 'repelling':
        per_walker += 40  # sort keys and group ranks per step
    return int(W * per_walker + W * hops * 72 + 40 * (num_edges + num_nodes))


def _parse_bytes(text: str) -> float:
    match = re.fullmatch(r'\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMGT]?)(I?B)?\s*', text.upper())
    if match is None:
        raise ValueError(f"${MEMORY_LIMIT_ENV} must be a size such as '64G' or '8000000000', or "
                         f"'off' (got {text!r})")
    scale = {'': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}[match.group(2)]
    return float(match.group(1)) * scale


def available_memory(device: Union[torch.device, str, None] = None) -> Optional[int]:
    r"""Bytes that can still be allocated on :obj:`device`: free GPU memory for CUDA
    (:func:`torch.cuda.mem_get_info`), ``MemAvailable`` of ``/proc/meminfo`` (capped by a cgroup
    memory limit and by the room left under ``RLIMIT_AS``) on the CPU; :obj:`None` when
    unknown."""
    device = torch.device(device or 'cpu')
    if device.type == 'cuda':
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except Exception:  # pragma: no cover
            return None
    rooms = []
    try:
        import resource
        with open('/proc/meminfo') as f:
            rooms += [int(line.split()[1]) * 1024 for line in f
                      if line.startswith('MemAvailable:')]
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]  # ulimit -v, whatever the RAM
        if soft != resource.RLIM_INFINITY and soft > 0:
            with open('/proc/self/statm') as f:
                rooms.append(max(soft - int(f.read().split()[0]) * resource.getpagesize(), 0))
    except (ImportError, OSError, ValueError):  # pragma: no cover (not Linux)
        return None
    for limit_file, used_file in (('memory.max', 'memory.current'),  # cgroup v2, then v1
                                  ('memory/memory.limit_in_bytes', 'memory/memory.usage_in_bytes')):
        try:
            with open(f'{CGROUP}/{limit_file}') as f, open(f'{CGROUP}/{used_file}') as g:
                limit, used = f.read().strip(), int(g.read())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:
            rooms.append(max(int(limit) - used, 0))
        break
    return min(rooms) if rooms else None


def memory_budget(device=None) -> Tuple[Optional[float], str]:
    r"""The bytes a new allocation may take on ``device`` and where the figure comes from:
    ``$PYG_GRF_MEMORY_LIMIT`` when set (``'off'``: no limit, :obj:`None`), else 90% of
    :func:`available_memory` (cgroups and ``RLIMIT_AS`` respected), :obj:`None` when
    unknown."""
    env = os.environ.get(MEMORY_LIMIT_ENV, '').strip()
    if env.lower() in ('off', 'none', 'inf', 'unlimited'):
        return None, f'${MEMORY_LIMIT_ENV}'
    if env:
        return _parse_bytes(env), f'${MEMORY_LIMIT_ENV}'
    avail = available_memory(device)
    return (None if avail is None else 0.9 * avail), f'90% of the available memory of {device}'


def check_walk_memory(estimate: int, device, memory_limit: Optional[float], what: str,
                      hint: str, error: type = WalkMemoryError) -> None:
    r"""Raises :class:`WalkMemoryError` when :obj:`estimate` bytes exceed :obj:`memory_limit`
    (bytes; :obj:`None`: ``$PYG_GRF_MEMORY_LIMIT``, else the available memory of
    :obj:`device`). ``what`` and ``hint`` may be callables returning the text, evaluated only
    when the check fails."""
    source = 'memory_limit'
    if memory_limit is None:
        if estimate < CHECK_ABOVE and not os.environ.get(MEMORY_LIMIT_ENV, '').strip():
            return
        memory_limit, source = memory_budget(device)
        if memory_limit is None:
            return
    if estimate <= memory_limit:
        return
    gib = 2**30
    what = what() if callable(what) else what
    hint = hint() if callable(hint) else hint
    raise error(
        f"{what} would need about {estimate / gib:.1f} GiB, more than {source} "
        f"({memory_limit / gib:.1f} GiB). {hint} To try anyway, "
        + ("pass memory_limit=float('inf') or " if error is WalkMemoryError else '')
        + f"set ${MEMORY_LIMIT_ENV}=off (or a size such as 64G).")
