r"""The learning-rate schedule of the tasks: linear warm-up, cosine decay, then a constant
learning rate (:func:`warmup_cosine_schedule`, torch's
:class:`~torch.optim.lr_scheduler.SequentialLR`), with its length in optimiser steps taken from
epochs (:func:`schedule_steps`)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, LinearLR, SequentialLR

#: Length of the last phase of :func:`warmup_cosine_schedule` (holding the final learning rate):
#: longer than any run.
_HOLD_STEPS = 2**62


def schedule_steps(stepping_batches: int, trainer_max_epochs: Optional[int],
                   warmup_epochs: float, max_epochs: Optional[int] = None) -> Tuple[int, int]:
    r"""``(warmup_steps, total_steps)`` of :func:`warmup_cosine_schedule` for a run of
    :obj:`stepping_batches` optimiser steps over :obj:`trainer_max_epochs` epochs (``None`` or
    ``-1``: a run bounded by steps, counted as one epoch): :obj:`warmup_epochs` and the cosine
    horizon :obj:`max_epochs` (default: the whole run) in epochs, turned into steps."""
    total = max(int(stepping_batches), 1)
    epochs = trainer_max_epochs if (trainer_max_epochs or -1) > 0 else None
    steps_per_epoch = total / epochs if epochs else total
    if max_epochs is not None:
        total = max(int(round(max_epochs * steps_per_epoch)), 1)
    warmup = min(int(round(warmup_epochs * steps_per_epoch)), total)
    return warmup, total


def warmup_cosine_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int,
                           total_steps: int, min_lr_ratio: float = 0.
                           ) -> SequentialLR:
    r"""Linear warm-up, cosine decay, then a constant learning rate, as torch's
    :class:`~torch.optim.lr_scheduler.SequentialLR` of ``LinearLR``, ``CosineAnnealingLR`` and
    ``ConstantLR``. With :math:`\eta` the optimizer's
    learning rate, :math:`w` = :obj:`warmup_steps`, :math:`T` = :obj:`total_steps` and
    :math:`r` = :obj:`min_lr_ratio`, the learning rate after :math:`s` scheduler steps is

    .. math::
        \eta_s = \begin{cases}
            \eta \, \frac{s + 1}{w + 1} & s < w \\
            \eta \left(r + (1 - r) \, \tfrac{1}{2}
                \left(1 + \cos \frac{\pi (s - w)}{T - w}\right)\right) & w \le s \le T \\
            r \, \eta & s > T.
        \end{cases}

    Args:
        optimizer (torch.optim.Optimizer): the optimizer; its groups share one ``lr``, the peak.
        warmup_steps (int): :math:`w`, ``0 <= w <= T`` (:obj:`0`: no warm-up).
        total_steps (int): :math:`T`, the end of the cosine decay, ``T >= 1``.
        min_lr_ratio (float, optional): :math:`r`, final learning rate / peak, in ``[0, 1]``
            (default: :obj:`0.`).
    """
    if not (total_steps >= 1 and 0 <= warmup_steps <= total_steps and 0 <= min_lr_ratio <= 1):
        raise ValueError(f"expected total_steps >= 1, 0 <= warmup_steps <= total_steps and "
                         f"0 <= min_lr_ratio <= 1, got total_steps={total_steps}, "
                         f"warmup_steps={warmup_steps}, min_lr_ratio={min_lr_ratio}")
    schedulers, milestones = [], []
    if warmup_steps > 0:
        schedulers.append(LinearLR(optimizer, start_factor=1. / (warmup_steps + 1),
                                   end_factor=1., total_iters=warmup_steps))
        milestones.append(warmup_steps)
    peaks = {group.get('initial_lr', group['lr']) for group in optimizer.param_groups}
    if len(peaks) != 1:  # CosineAnnealingLR has one eta_min for all groups
        raise ValueError(f"expected one learning rate for all parameter groups, got "
                         f"{sorted(peaks)}")
    peak = peaks.pop()
    schedulers.append(CosineAnnealingLR(optimizer, T_max=max(total_steps - warmup_steps, 1),
                                        eta_min=min_lr_ratio * peak))
    milestones.append(max(total_steps, warmup_steps + 1))
    schedulers.append(ConstantLR(optimizer, factor=min_lr_ratio, total_iters=_HOLD_STEPS))
    return SequentialLR(optimizer, schedulers, milestones)


__all__ = ['schedule_steps', 'warmup_cosine_schedule']
