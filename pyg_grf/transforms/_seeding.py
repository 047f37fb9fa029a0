r"""One seeding rule for the random transforms (:class:`~pyg_grf.transforms.AddRWGNKFeatures`,
:class:`~pyg_grf.transforms.AddGraphRandomFeatures`,
:class:`~pyg_grf.transforms.AddGraphBridgeTokens`).

With ``seed=None`` the draws come from torch's global generator (which PyTorch seeds
differently in every DataLoader worker and epoch). With ``seed=s`` a transform owns a private
generator: in the main process it is seeded with ``s`` once, at the first call, and *advances*
over the calls (a ``pre_transform`` gives the same features on every run; a ``transform``
draws fresh ones at every access, in a reproducible sequence); in a DataLoader worker it is
re-seeded from ``s`` and the worker's seed (``base_seed + worker_id``, new every epoch), so
workers never repeat each other's draws and everything is reproducible under
``seed_everything``.
"""
from __future__ import annotations

import hashlib
import os
from typing import Dict, Optional, Tuple

import torch


def _mix(seed: int, worker_seed: Optional[int]) -> int:
    if worker_seed is None:
        return int(seed)
    text = f'{int(seed)}:{int(worker_seed)}'.encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], 'little') & (2**63 - 1)


class TransformRNG:
    r"""The private random source of a transform with ``seed`` (see the module docstring;
    :obj:`None`: torch's global generator)."""

    def __init__(self, seed: Optional[int]):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"'seed' must be an integer or None (got {seed!r})")
        self.seed = seed
        self._generators: Dict[str, torch.Generator] = {}
        self._key: Optional[Tuple[int, Optional[int]]] = None

    def generator(self, device=None) -> Optional[torch.Generator]:
        r"""The generator to draw from on :obj:`device` (CPU by default), or :obj:`None` for
        torch's global generator when unseeded."""
        if self.seed is None:
            return None
        info = torch.utils.data.get_worker_info()
        key = (os.getpid(), None if info is None else int(info.seed))
        if key != self._key:  # a new process, worker or epoch
            self._generators = {}
            self._key = key
        device = torch.device(device or 'cpu')
        name = str(device)
        gen = self._generators.get(name)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed(_mix(self.seed, key[1]))
            self._generators[name] = gen
        return gen

    def __getstate__(self):
        # The generator states travel with a pickled copy; a copy in another process or worker
        # is re-seeded there anyway (its key differs).
        return {'seed': self.seed, 'key': self._key,
                'states': {name: gen.get_state() for name, gen in self._generators.items()}}

    def __setstate__(self, state):
        self.__init__(state['seed'])
        self._key = state.get('key')
        for name, value in (state.get('states') or {}).items():
            gen = torch.Generator(device=torch.device(name))
            gen.set_state(value)
            self._generators[name] = gen

    def __repr__(self) -> str:
        return f'TransformRNG(seed={self.seed})'


__all__ = ['TransformRNG']
