"""``train.precision: auto``: bf16 where the hardware multiplies bf16 matrices natively, fp32 elsewhere.

Measured on two 2-core AMD EPYC machines this project ran on, 1024 x 1024 matrix products, torch 2.13.0:
one with AVX-512 bf16 ran bf16 about 4x faster than fp32; one with AVX2 only (no bf16 instructions, so
oneDNN is not used and torch falls back to a scalar kernel) ran bf16 at 0.74 GFLOP/s against 56 GFLOP/s
for fp32, 76x slower. A fixed bf16 default would make such a machine useless, hence ``auto``.
"""
from __future__ import annotations

import functools
import sys

import torch


@functools.lru_cache(maxsize=None)
def cpu_has_fast_bf16() -> bool:
    """True when oneDNN runs bf16 matrix products on this CPU (AVX-512 or AMX; torch's own check)."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the check: assume the slow fallback
        return False


def _on_cuda(accelerator: str) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(precision: str, accelerator: str = "auto") -> str:
    """The Lightning precision a run uses: ``auto`` becomes bf16-mixed on GPUs with bf16 (16-mixed on
    older GPUs, as fairseq's --fp16) and on CPUs with native bf16, else 32. Other values pass through,
    with a warning when bf16 is asked for on a CPU that emulates it."""
    cuda = _on_cuda(accelerator)
    if precision == "auto":
        if cuda:
            return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
        if accelerator in ("auto", "cpu"):
            return "bf16-mixed" if cpu_has_fast_bf16() else "32"
        return "32"
    if precision.startswith("bf16") and not cuda and accelerator in ("auto", "cpu") and not cpu_has_fast_bf16():
        _warn_slow_bf16()
    return precision


@functools.lru_cache(maxsize=None)
def _warn_slow_bf16() -> None:
    print("ltfm: warning: this CPU has no native bf16 (matrix products run ~70x slower than fp32 here); "
          "train.precision=auto picks fp32 on such a CPU", file=sys.stderr)


def decode_dtype(precision: str, accelerator: str = "auto") -> torch.dtype | None:
    """bf16 autocast for decoding when the run's precision resolves to bf16 and this device runs bf16
    natively; otherwise None (the model's fp32). A bf16 run evaluated on an AVX2-only CPU decodes in fp32."""
    p = resolve_precision(precision, accelerator) if precision == "auto" else precision
    if not p.startswith("bf16"):
        return None
    return torch.bfloat16 if (_on_cuda(accelerator) or cpu_has_fast_bf16()) else None
