"""train.precision=auto: bf16 only where the hardware runs it natively; what a run used is recorded."""
import platform
from pathlib import Path

import pytest
import torch

from lightning_tfm.training import precision as P


def trainer_matmul_dtype(precision: str) -> torch.dtype:
    """The dtype a matrix product gets inside a real Lightning Trainer built with ``precision``."""
    import pytorch_lightning as pl

    trainer = pl.Trainer(accelerator="cpu", devices=1, precision=precision, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with trainer.precision_plugin.forward_context():
        return (torch.ones(4, 4) @ torch.ones(4, 4)).dtype


def test_auto_precision_follows_the_cpu(monkeypatch):
    """Given the CPU's bf16 capability, ``auto`` makes the Trainer multiply in bf16 or in fp32."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for fast, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(P, "cpu_has_fast_bf16", lambda fast=fast: fast)
        for accelerator in ("auto", "cpu"):
            assert trainer_matmul_dtype(P.resolve_precision("auto", accelerator)) == want
        # decoding follows: bf16 autocast only where bf16 is native, even for a run trained in bf16
        assert P.decode_dtype("auto", "cpu") == (torch.bfloat16 if fast else None)
        assert P.decode_dtype("bf16-mixed", "cpu") == (torch.bfloat16 if fast else None)
        assert P.decode_dtype("32", "cpu") is None
        # an explicit choice is kept (with a warning when it is the slow one)
        assert trainer_matmul_dtype(P.resolve_precision("bf16-mixed", "cpu")) == torch.bfloat16
        assert trainer_matmul_dtype(P.resolve_precision("32", "cpu")) == torch.float32


def test_the_precision_a_run_uses_is_lightnings_full_name(monkeypatch, tmp_path):
    """What summary.json records is Lightning's full name ("32-true", "bf16-mixed", "16-mixed"), never the bare "32";
    a summary written before (its run and its attempts saying "32") reads as the full name, and the report's
    headline names an older export's "32" and a newer run's "32-true" as one fp32."""
    import json

    from lightning_tfm.report.views.render import precision_names
    from lightning_tfm.training.runs.results import load_summary

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(P, "cpu_has_fast_bf16", lambda: False)
    assert P.resolve_precision("auto", "cpu") == P.resolve_precision("32", "cpu") == "32-true"
    assert P.resolve_precision("auto", "mps") == "32-true"
    assert P.resolve_precision("16-mixed", "cpu") == "16-mixed"
    assert P.resolve_precision("bf16-true", "gpu") == "bf16-true"
    (tmp_path / "summary.json").write_text(json.dumps({"run_id": "r", "status": "completed", "precision": "32",
                                                       "attempts": [{"status": "failed", "precision": "32"}]}))
    summary, problem = load_summary(tmp_path)
    assert problem is None and summary["precision"] == summary["attempts"][0]["precision"] == "32-true"
    assert precision_names(["32", "32-true", "bf16-mixed"]) == ["fp32", "bf16 (mixed)"]


def test_auto_precision_on_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for bf16, want in ((True, "bf16-mixed"), (False, "16-mixed")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda bf16=bf16: bf16)
        assert P.resolve_precision("auto", "gpu") == want
        assert P.resolve_precision("auto", "auto") == want


def isa_has_native_bf16() -> bool:
    """From the CPU flags the kernel reports (independent of torch): oneDNN multiplies bf16 natively from
    AVX-512 (F, BW, VL, DQ; its avx512_core) or AVX2 with AVX-NE-CONVERT; AVX2 alone has no bf16
    instructions (the project's AVX2 machine ran bf16 76x slower than fp32, precision.py)."""
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() not in ("x86_64", "AMD64") or not cpuinfo.exists():
        pytest.skip("CPU flags are read from /proc/cpuinfo on x86-64 Linux")
    flags = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags


def test_fast_bf16_check_follows_the_cpu_flags():
    assert P.cpu_has_fast_bf16() == isa_has_native_bf16()


def test_smoke_run_records_the_precision_it_used(smoke_run):
    """The default (auto) is resolved at run time and written to summary.json, beside the unresolved config."""
    import json

    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["config"]["train"]["precision"] == "auto"
    assert summary["precision"] == ("bf16-mixed" if isa_has_native_bf16() else "32-true")


def test_bench_rejects_unknown_dtypes(ltfm_here):
    p = ltfm_here("bench", "--dtypes", "fp16")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "fp32" in p.stderr and "Traceback" not in p.stderr
