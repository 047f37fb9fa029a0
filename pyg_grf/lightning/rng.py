r"""Resumable randomness: the states of torch's, NumPy's and Python's random generators (and
CUDA's, when in use), saved in a task's checkpoint so that a resumed run draws the same dropout
masks and PE sign flips as an uninterrupted one."""
from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch


def rng_states() -> Dict[str, Any]:
    r"""The current random states, as tensors and plain Python objects, so that
    ``torch.load(weights_only=True)`` accepts them; :func:`set_rng_states` restores them."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        'torch': torch.get_rng_state(),
        'numpy': [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                  float(gauss)],
        'python': random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states['cuda'] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Dict[str, Any]) -> None:
    r"""Restores the random states saved by :func:`rng_states` (CUDA's only where CUDA is
    available)."""
    torch.set_rng_state(states['torch'])
    name, keys, pos, has_gauss, gauss = states['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    py = states['python']
    random.setstate((py[0], tuple(py[1]), py[2]))
    if 'cuda' in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states['cuda'])


__all__ = ['rng_states', 'set_rng_states']
