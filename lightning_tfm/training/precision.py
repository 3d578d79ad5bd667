"""``train.precision: auto``: bf16 where the hardware multiplies bf16 matrices natively, fp32 elsewhere.

On a CPU without AVX-512 bf16 or AMX, oneDNN does not run bf16 and torch falls back to a scalar kernel many
times slower than fp32 (reports/timing.md has the measured ratio), hence ``auto`` rather than a fixed bf16.
"""
from __future__ import annotations

import functools
import sys

import torch

from .runs.results import precision_name


@functools.lru_cache(maxsize=None)
def cpu_has_fast_bf16() -> bool:
    """True when oneDNN runs bf16 matrix products on this CPU (AVX-512 or AMX; torch's own check)."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the check: assume the slow fallback
        return False


def _on_cuda(accelerator: str) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def auto_precision(device: str, native_bf16: bool) -> str:
    """What ``auto`` means on ``device`` ("cuda", "cpu" or another accelerator): bf16-mixed where bf16 is
    native; on older GPUs 16-mixed with a loss scaler (as fairseq's --fp16); fp32 on other CPUs and devices
    (:func:`resolve_precision` gives each by its full name)."""
    if device == "cuda":
        return "bf16-mixed" if native_bf16 else "16-mixed"
    if device == "cpu":
        return "bf16-mixed" if native_bf16 else "32"
    return "32"


def resolve_precision(precision: str, accelerator: str = "auto") -> str:
    """The Lightning precision a run uses, by its full name (``32-true``, ``bf16-mixed``, ``16-mixed``: what
    summary.json records, :func:`~.runs.results.precision_name`): ``auto`` as :func:`auto_precision` says for this
    machine; other values by their full name, with a warning when bf16 is asked for on a CPU that emulates it."""
    cuda = _on_cuda(accelerator)
    if precision == "auto":
        if cuda:
            return precision_name(auto_precision("cuda", torch.cuda.is_bf16_supported()))
        return precision_name(auto_precision("cpu", cpu_has_fast_bf16()) if accelerator in ("auto", "cpu") else "32")
    if precision.startswith("bf16") and not cuda and accelerator in ("auto", "cpu") and not cpu_has_fast_bf16():
        _warn_slow_bf16()
    return precision_name(precision)


@functools.lru_cache(maxsize=None)
def _warn_slow_bf16() -> None:
    print("ltfm: warning: this CPU has no native bf16 (its bf16 matrix products run many times slower than fp32); "
          "train.precision=auto picks fp32 on such a CPU", file=sys.stderr)


def decode_dtype(precision: str, accelerator: str = "auto") -> torch.dtype | None:
    """bf16 autocast for decoding when the run's precision resolves to bf16 and this device runs bf16
    natively; otherwise None (the model's fp32). A bf16 run evaluated on an AVX2-only CPU decodes in fp32."""
    p = resolve_precision(precision, accelerator) if precision == "auto" else precision
    if not p.startswith("bf16"):
        return None
    return torch.bfloat16 if (_on_cuda(accelerator) or cpu_has_fast_bf16()) else None
