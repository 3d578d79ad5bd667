"""The optimizer and the learning-rate schedules: the paper's (Section 5.3, Eq. 3), stepped once per optimizer
step, and the recurrent recipes' constant rate decayed on a plateau of the dev loss (``train.lr_schedule``)."""
from __future__ import annotations

import torch

from .config.config import TrainConfig


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)  (Sec. 5.3, Eq. 3); step counts from 1."""
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def adam(params, **kwargs) -> torch.optim.Adam:
    """torch's Adam with its fused kernel: one pass over all parameters, several times faster per step than
    the default for-loop or foreach implementations on CPU. Same update rule, so the same training
    (tests/test_speed_paths.py)."""
    params = list(params)
    devices = {p.device.type for p in params if isinstance(p, torch.Tensor)} or {"cpu"}
    fused = devices <= {"cpu", "cuda", "mps", "xpu"}
    return torch.optim.Adam(params, fused=fused, **kwargs)


def make_optimizer(params, train_cfg: TrainConfig, d_model: int):
    """Adam (``train.adam_*``; the paper's beta1=0.9, beta2=0.98, eps=1e-9) and its schedule, by
    ``train_cfg.lr_schedule``:

    * ``noam``: Eq. 3 as a LambdaLR, stepped once per optimizer step;
    * ``plateau``: the rate ``train_cfg.lr``, times ``lr_decay_factor`` at the ``lr_patience + 1``-th validation
      in a row that brought no dev loss lower than the best so far (by 1e-4), never below ``lr_min``; the count
      restarts after a decay: torch's ReduceLROnPlateau as joeynmt's ``scheduling: plateau`` sets it up, stepped
      with the dev loss of every validation by training/lit.py.
    """
    if train_cfg.lr_schedule == "plateau":
        opt = adam(params, lr=train_cfg.lr, betas=(train_cfg.adam_beta1, train_cfg.adam_beta2), eps=train_cfg.adam_eps)
        return opt, torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, mode="min", factor=train_cfg.lr_decay_factor, patience=train_cfg.lr_patience,
            threshold=1e-4, threshold_mode="abs", min_lr=train_cfg.lr_min)
    opt = adam(params, lr=1.0, betas=(train_cfg.adam_beta1, train_cfg.adam_beta2), eps=train_cfg.adam_eps)
    # LambdaLR multiplies the base lr (1.0) by the factor of the (0-based) scheduler step; Eq. 3 counts from 1.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: noam_lr(s + 1, d_model, train_cfg.warmup, train_cfg.lr_scale))
    return opt, sched
