"""train.precision=auto: bf16 only where the hardware runs it natively; what a run used is recorded."""
import torch

from lightning_tfm import precision as P


def test_auto_precision_follows_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for fast, want in ((True, "bf16-mixed"), (False, "32")):
        monkeypatch.setattr(P, "cpu_has_fast_bf16", lambda fast=fast: fast)
        assert P.resolve_precision("auto", "auto") == want
        assert P.resolve_precision("auto", "cpu") == want
        # decoding follows: bf16 autocast only where bf16 is native, even for a run trained in bf16
        assert P.decode_dtype("auto", "cpu") == (torch.bfloat16 if fast else None)
        assert P.decode_dtype("bf16-mixed", "cpu") == (torch.bfloat16 if fast else None)
        assert P.decode_dtype("32", "cpu") is None
    # an explicit choice is kept (with a warning when it is the slow one)
    assert P.resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
    assert P.resolve_precision("32", "cpu") == "32"


def test_auto_precision_on_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for bf16, want in ((True, "bf16-mixed"), (False, "16-mixed")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda bf16=bf16: bf16)
        assert P.resolve_precision("auto", "gpu") == want
        assert P.resolve_precision("auto", "auto") == want


def test_fast_bf16_check_matches_torchs_onednn_check():
    """The check is torch's own oneDNN check; a CPU without AVX-512 (this project's AVX2 machines) has no
    bf16 instructions, so it must come out False there."""
    want = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert P.cpu_has_fast_bf16() == bool(want)
    cap = torch.backends.cpu.get_cpu_capability()
    if cap in ("AVX2", "DEFAULT", "NO AVX"):  # no AVX-512: no bf16 instructions for oneDNN to use
        assert not P.cpu_has_fast_bf16()


def test_smoke_run_records_the_precision_it_used(smoke_run):
    """The default (auto) is resolved at run time and written to summary.json, beside the unresolved config."""
    import json

    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["config"]["train"]["precision"] == "auto"
    assert summary["precision"] == ("bf16-mixed" if P.cpu_has_fast_bf16() else "32")


def test_bench_rejects_unknown_dtypes():
    from conftest import ltfm

    p = ltfm("bench", "--dtypes", "fp16")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "fp32" in p.stderr and "Traceback" not in p.stderr
