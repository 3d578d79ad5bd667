"""The GPU path. The decisions (precision, attention kernels, the launcher's device plan, the Makefile's torch,
make gpu-check's rehearsal and its wheels' check) are tested on any machine; the tests marked ``cuda`` run the model
on a CUDA GPU and skip cleanly without one (``make gpu-check`` runs them first)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import ROOT, ltfm

cuda = pytest.mark.cuda


# ------------------------------------------------------------------------------------------ any machine
def test_auto_precision_on_each_device():
    from lightning_tfm.training.precision import auto_precision

    assert auto_precision("cuda", True) == "bf16-mixed"    # A100, H100: bf16 autocast
    assert auto_precision("cuda", False) == "16-mixed"     # V100, T4: fp16 with a loss scaler
    assert auto_precision("cpu", True) == "bf16-mixed" and auto_precision("cpu", False) == "32"
    assert auto_precision("mps", True) == "32"


def test_cuda_takes_sdpa_and_the_cpu_speed_paths_stay_on_the_cpu():
    from lightning_tfm.model.fast import MATMUL_MAX_KEYS, attention_path

    assert attention_path("auto", "cuda", 20) == "sdpa"  # flash / memory-efficient kernels
    assert attention_path("auto", "cpu", 20) == "matmul"
    assert attention_path("auto", "cpu", MATMUL_MAX_KEYS + 1) == "sdpa"
    assert attention_path("matmul", "cuda", 20) == "matmul" and attention_path("sdpa", "cpu", 20) == "sdpa"


def test_sdpa_causal_without_a_mask_tensor_is_the_masked_attention():
    """The decoder's training self-attention goes to SDPA as is_causal (what lets CUDA pick flash): the same
    function as the explicit triangular mask, and the prefix case (fewer queries than keys) keeps the mask."""
    from lightning_tfm.model.attention import causal_mask, reference_attention, sdpa_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 16, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(sdpa_attention(q, k, v, None, causal=True),
                               reference_attention(q, k, v, causal_mask(q, k, None)))
    q3 = q[:, :, -3:]
    torch.testing.assert_close(sdpa_attention(q3, k, v, None, causal=True),
                               reference_attention(q3, k, v, causal_mask(q3, k, None)))


GPU_STEPS = ("CUDA-marked tests", "smoke training, bf16 on cuda", "evaluate from its checkpoint",
             "translate from its checkpoint", "bench vs Marian, the paper's base shapes",
             "bench vs Marian, the CPU protocol's shapes", "1-GPU DDP run (Lightning ddp strategy)",
             "Table 3 GPU rows base, C1, C5 (one seed, --workers auto)", "make ablation QUICK=1 (the time left)")


def test_gpu_check_rehearsal_runs_every_step_past_failures_and_says_why_it_skipped(tmp_path):
    """Without CUDA, make gpu-check is its rehearsal: a carried wheel pip refuses and a smoke training that cannot read
    its data fail, yet every later step still runs; the summary lists every step with its status and time (and budget),
    and each skipped step says why; exit 1 for the failures."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: make gpu-check runs for real here")
    carry, out, work = tmp_path / "carry", tmp_path / "out", tmp_path / "work"
    (carry / "wheels").mkdir(parents=True)
    (carry / "wheels" / "broken-1.0-py3-none-any.whl").write_text("not a zip")
    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "WORK": str(work), "CARRY": str(carry),
           "DATA": str(tmp_path / "no-data"), "PY312": ""}
    p = subprocess.run(["bash", str(ROOT / "tests/gpu_check.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    summary = (out / "summary.md").read_text()
    table = [line.strip("| ").split(" | ") for line in summary.splitlines()
             if line.startswith("| ") and not line.startswith("| --- |")]
    steps = {r[0]: r for r in table[1:]}
    assert [r[0] for r in table[1:]] == ["install the carried wheels", "check them against the machine's packages",
                                         "import the carried modules", "tiny smoke training on the CPU", *GPU_STEPS]
    for name in ("install the carried wheels", "check them against the machine's packages",
                 "tiny smoke training on the CPU"):
        status, secs, budget = steps[name][1:4]
        assert status.startswith("FAIL (exit") and secs.isdigit() and budget.isdigit(), steps[name]
    assert "no-data" in steps["tiny smoke training on the CPU"][4]  # the failure's own line, in the summary
    assert steps["import the carried modules"][1] == "skipped"
    assert "Python 3.12" in steps["import the carried modules"][4]
    assert all(steps[s][1] == "skipped" and "no CUDA" in steps[s][4] for s in GPU_STEPS)
    log = (out / "gpu-check.log").read_text()
    assert log.index("--- install the carried wheels: FAIL") < log.index("=== tiny smoke training on the CPU")
    assert sorted(f.name for f in out.iterdir()) == ["gpu-check.log", "summary.md"]


def _wheel(folder, name, version, requires=(), requires_python=None):
    import zipfile

    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += f"Requires-Python: {requires_python}\n" if requires_python else ""
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)


def test_depcheck_finds_what_would_break_the_carried_wheels_on_the_gpu_image(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_tools", ROOT / "tests/gpu/tools.py")
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    manifest = tmp_path / "image.txt"
    manifest.write_text("python==3.12.3\nnumpy==2.5.2\nattrs\n")
    ok = tmp_path / "ok"
    ok.mkdir()
    _wheel(ok, "aaa", "1.0", ["numpy>=2", "bbb==2.0", "attrs>=22", 'colorama; sys_platform == "win32"'])
    _wheel(ok, "bbb", "2.0", requires_python=">=3.10")
    assert tools.depcheck(str(ok), str(manifest)) == 0
    assert "unverified (version not listed; read on the device): aaa 1.0 requires attrs>=22" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.mkdir()
    _wheel(bad, "ccc", "1.0", ["numpy>=3", "ddd"], requires_python=">=3.13")
    _wheel(bad, "eee", "1.0")
    _wheel(bad, "eee", "1.1")
    assert tools.depcheck(str(bad), str(manifest)) == 1
    out = capsys.readouterr().out
    assert "CONFLICT: ccc 1.0 requires numpy>=3: numpy 2.5.2 is on the machine" in out
    assert "CONFLICT: ccc 1.0 requires ddd: neither carried nor on the machine" in out
    assert "CONFLICT: ccc 1.0 requires Python >=3.13: the machine has 3.12.3" in out
    assert "CONFLICT: two versions of eee: 1.0 and 1.1" in out


def _setup_commands(tmp_path, torch_version: str, cuda_version: str | None) -> str:
    """``make -n setup`` with a python whose ``import torch`` finds a stand-in of the given build."""
    fake = tmp_path / f"site-{torch_version}"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(f"__version__ = {torch_version!r}\n"
                                                f"class version:\n    cuda = {cuda_version!r}\n")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    p = subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'venv'}", f"PYTHON={sys.executable}"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_make_setup_keeps_a_cuda_torch_and_pins_torch_elsewhere(tmp_path):
    gpu_box = _setup_commands(tmp_path, "2.11.0+cu130", "13.0")
    assert "--system-site-packages" in gpu_box and "torch==2.13.0" not in gpu_box
    for version, cuda_version in (("2.13.0+cpu", None), ("2.3.1+cu121", "12.1")):  # a CPU build; too old a torch
        other = _setup_commands(tmp_path, version, cuda_version)
        assert "torch==2.13.0" in other and "--system-site-packages" not in other


def test_bench_on_cuda_without_a_gpu_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    p = ltfm("bench", "--device", "cuda")
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "--device cpu" in p.stderr


# ---------------------------------------------------------------------------------------------- on CUDA
def _model(vocab=300):
    from lightning_tfm.model import ModelConfig, build_model

    torch.manual_seed(0)
    return build_model(ModelConfig(layers=2, d_model=64, d_ff=128, heads=4, d_k=16, d_v=16, dropout=0.0), vocab)


def _batch(vocab=300, b=6, s=11, t=9):
    from lightning_tfm.model import PAD

    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (b, s), generator=g)
    tgt = torch.randint(4, vocab, (b, t), generator=g)
    src[0, 7:] = PAD  # padding: the memory-efficient kernel with a key mask
    tgt[1, 5:] = PAD
    return src, tgt


@cuda
def test_bf16_training_step_on_cuda_matches_fp32_on_the_cpu():
    from lightning_tfm.training.loss import fused_label_smoothed_nll_loss

    src, tgt = _batch()
    cpu, gpu = _model(), _model().cuda()
    loss_cpu, _, n = fused_label_smoothed_nll_loss(cpu.features(src, tgt), cpu.output_weight, tgt, 0.1)
    (loss_cpu / n).backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        feats = gpu.features(src.cuda(), tgt.cuda())
        loss_gpu, _, n_gpu = fused_label_smoothed_nll_loss(feats, gpu.output_weight, tgt.cuda(), 0.1)
    (loss_gpu / n_gpu).backward()
    assert int(n_gpu) == int(n)
    assert abs(float(loss_gpu) - float(loss_cpu)) / float(loss_cpu) < 1e-2  # bf16 operands
    g_cpu, g_gpu = cpu.embed.weight.grad, gpu.embed.weight.grad.float().cpu()
    assert torch.isfinite(g_gpu).all() and ((g_gpu - g_cpu).norm() / g_cpu.norm()) < 5e-2


@cuda
def test_sdpa_flash_kernel_takes_the_decoders_causal_self_attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lightning_tfm.model.attention import causal_mask, reference_attention, sdpa_attention

    q, k, v = (torch.randn(8, 4, 33, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if flash cannot take the call
        out = sdpa_attention(q, k, v, None, causal=True)
    ref = reference_attention(q.double(), k.double(), v.double(), causal_mask(q, k, None))
    assert ((out.double() - ref).norm() / ref.norm()) < 1e-2
    mask = torch.ones(8, 1, 1, 33, dtype=torch.bool, device="cuda")
    mask[0, ..., 20:] = False
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):  # a padding mask: the memory-efficient kernel
        out = sdpa_attention(q, k, v, mask)
    ref = reference_attention(q.double(), k.double(), v.double(), mask)
    assert ((out.double() - ref).norm() / ref.norm()) < 1e-2


@cuda
def test_beam_search_on_cuda_gives_the_cpus_hypotheses_with_one_sync_a_step():
    from lightning_tfm.training.decode import beam_search

    src, _ = _batch()
    cpu, gpu = _model().eval(), _model().cuda().eval()
    want = beam_search(cpu, src, beam_size=4, max_len_b=12)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = beam_search(gpu, src.cuda(), beam_size=4, max_len_b=12)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [h.tokens for h in got] == [h.tokens for h in want]
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    steps = max(len(h.tokens) for h in want) + 2
    assert len(syncs) <= 2 * steps + 6, len(syncs)  # one a step, plus sentence drops and the start and end


@cuda
def test_pinned_batches_reach_the_gpu_unchanged():
    from lightning_tfm.training.data.data import collate

    batch = collate([([5, 6, 7], [8, 9]), ([10], [11, 12, 13])]).pin_memory()
    assert batch.src.is_pinned() and batch.tgt_out.is_pinned()
    on_gpu = batch.to(torch.device("cuda"))
    torch.cuda.synchronize()
    assert on_gpu.src.is_cuda and torch.equal(on_gpu.src.cpu(), batch.src)


@cuda
def test_the_launcher_sees_this_machines_gpus():
    from lightning_tfm.sweep.launch import visible_gpus, worker_plan

    gpus = visible_gpus()
    assert len(gpus) == torch.cuda.device_count() >= 1
    plan = worker_plan("auto", gpus, os.cpu_count() or 1, per_gpu=4)
    assert len(plan) == 4 * len(gpus) and {s.gpu for s in plan} == set(gpus)
