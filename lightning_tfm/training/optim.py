"""The optimizer and the learning-rate schedule (Section 5.3, Eq. 3)."""
from __future__ import annotations

import torch

from .config import TrainConfig


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
    """Adam(beta1=0.9, beta2=0.98, eps=1e-9) with the schedule of Eq. 3, stepped once per optimizer step."""
    opt = adam(params, lr=1.0, betas=(train_cfg.adam_beta1, train_cfg.adam_beta2), eps=train_cfg.adam_eps)
    # LambdaLR multiplies the base lr (1.0) by the factor of the (0-based) scheduler step; Eq. 3 counts from 1.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: noam_lr(s + 1, d_model, train_cfg.warmup, train_cfg.lr_scale))
    return opt, sched
