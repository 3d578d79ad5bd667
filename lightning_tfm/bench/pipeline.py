"""``ltfm bench --data N``: the data pipeline at scale, on a generated corpus of N sentence pairs.

The corpus is Multi30k's training sentences joined two by two (~26 words a side), written to a
temporary folder, with Multi30k's dev set. The benchmark runs real ``ltfm`` subprocesses and prints:

* the first ``ltfm prepare`` (wall time, peak RSS);
* two trials of experiments/multi30k-cpu.yaml (different seeds, so different runs) on the prepared
  corpus: the second one's time from its start to its first training step, and each one's peak RSS;
* the same trial on Multi30k itself (the RSS baseline: what the larger corpus adds);
* a 2-process DDP trial (gloo, CPU): each rank's peak RSS, and the peak of the ranks' summed
  proportional set size (PSS: a page two processes share counts half in each), which shows whether the
  arrays are mapped once;
* the prepared corpus's size on disk.

It is a benchmark, not a test: at N = 1,000,000 it takes several minutes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..base.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = ROOT.parent / "shared" / "data" / "multi30k"
MAX_PAIRS = 10 ** 8  # pairs --data generates at most (a few GB of text, hours of BPE)
TRIAL = ["train.max_steps=1", "train.val_every_steps=1000", "train.checkpoint_every_steps=1000",
         "data.test_split=null", "data.max_dev_pairs=100", "data.max_train_pairs=null", "decode.beam_size=1",
         "decode.max_len_b=5", "train.record_batches=true", "train.progress_bar=false", "train.accelerator=cpu"]


def generate(source: Path, out: Path, n: int) -> None:
    """N pairs of Multi30k sentences joined two by two (cycling), plus Multi30k's dev set."""
    from ..training.data.data import read_parallel

    src, tgt = read_parallel(source, "train", "en", "de")
    m = len(src)
    out.mkdir(parents=True, exist_ok=True)
    for lang, lines in (("en", src), ("de", tgt)):
        with open(out / f"train.{lang}", "w", encoding="utf-8") as f:
            for k in range(n):
                f.write(f"{lines[(2 * k) % m]} {lines[(2 * k + 1) % m]}\n")
        dev = read_parallel(source, "val", "en", "de")[0 if lang == "en" else 1]
        (out / f"val.{lang}").write_text("".join(x + "\n" for x in dev), encoding="utf-8")


def _tree(pid: int):
    import psutil
    try:
        p = psutil.Process(pid)
        return [p] + p.children(recursive=True)
    except psutil.Error:
        return []


def _mem(p) -> tuple[int, int, int]:
    """(peak RSS so far, RSS, PSS) of one process in bytes, from /proc."""
    hwm = rss = pss = 0
    try:
        for line in open(f"/proc/{p.pid}/status"):
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        for line in open(f"/proc/{p.pid}/smaps_rollup"):
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return hwm, rss, pss


def run(args: list[str], watch: Path | None = None, env: dict | None = None) -> dict:
    """Run ``ltfm ARGS``; its wall time, when ``watch`` appeared, per-process peak RSS and peak summed PSS."""
    e = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", **(env or {})}
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "lightning_tfm", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=e)
    peaks: dict[int, int] = {}
    pss_peak, first = 0, None
    import threading
    out: dict = {}
    reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate())))
    reader.start()
    while proc.poll() is None:
        pss = 0
        import psutil
        for p in _tree(proc.pid):
            try:
                if p.pid != proc.pid and "python" not in p.name():
                    continue
            except psutil.Error:  # gone meanwhile
                continue
            hwm, _, ps = _mem(p)
            peaks[p.pid] = max(peaks.get(p.pid, 0), hwm)
            pss += ps
        pss_peak = max(pss_peak, pss)
        if first is None and watch is not None and watch.exists():
            first = time.time() - started
        time.sleep(0.2)
    reader.join()
    print(f"ltfm bench --data: ltfm {args[0]} ({args[-1]}): {time.time() - started:.1f} s, first step "
          f"{first if first is None else round(first, 1)} s, peak RSS {sorted(peaks.values(), reverse=True)[:2]}",
          file=sys.stderr, flush=True)
    if proc.returncode != 0:
        raise UserError(f"benchmark step `ltfm {' '.join(args[:2])} ...` failed: "
                        f"{(out.get('stderr') or '').strip().splitlines()[-1:]}")
    return {"wall_s": round(time.time() - started, 1), "first_step_s": None if first is None else round(first, 1),
            "peak_rss_mb": sorted((round(v / 2**20) for v in peaks.values()), reverse=True),
            "peak_total_pss_mb": round(pss_peak / 2**20)}


def bench_data(n: int, source: Path = DEFAULT_SOURCE, work: Path | None = None, ddp: bool = True) -> dict:
    from ..training.data.corpus import folder_size

    if not 2 <= n <= MAX_PAIRS:
        raise UserError(f"--data {n}: give the number of pairs to generate, from 2 to {MAX_PAIRS} (e.g. 1000000)")
    if not (source / "train.en.gz").is_file() and not (source / "train.en").is_file():
        raise UserError(f"Multi30k not found at {source}: set LTFM_DATA to a folder with train/val .en/.de files")
    work = Path(work or tempfile.mkdtemp(prefix="ltfm-bench-data-"))
    data, results, cache = work / "corpus", work / "results", work / "data-cache"
    t = time.time()
    generate(source, data, n)
    out: dict = {"pairs": n, "generate_s": round(time.time() - t, 1), "cpus": os.cpu_count(),
                 "load_average": [round(x, 2) for x in os.getloadavg()]}
    exp = str(ROOT / "experiments" / "multi30k-cpu.yaml")
    common = [f"run.results_dir={results}", f"data.cache_dir={cache}", *TRIAL]
    out["prepare"] = run(["prepare", exp, f"data.path={data}", *common])
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    out["cache_mb"] = round(folder_size(folder) / 2**20, 1)
    manifest = json.loads((folder / "manifest.json").read_text())
    out["train_pairs"] = manifest["splits"]["train"]["pairs"]

    def trial(name, path, *extra):
        rid = f"bench-{name}"
        return run(["train", exp, f"data.path={path}", *common, f"run.id={rid}", *extra],
                   watch=results / rid / "batches" / "rank0.jsonl")

    out["trial1"] = trial("trial1", data, "run.seed=1")
    out["trial2"] = trial("trial2", data, "run.seed=2")
    run(["prepare", exp, f"data.path={source}", *common])
    out["multi30k_trial"] = trial("multi30k", source, "run.seed=2")
    out["rss_growth_mb"] = out["trial2"]["peak_rss_mb"][0] - out["multi30k_trial"]["peak_rss_mb"][0]
    if ddp:
        out["ddp_trial"] = trial("ddp", data, "run.seed=3", "train.devices=2", "train.strategy=ddp",
                                 "train.threads=1")
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def bench_data_cli(args) -> int:
    import shutil

    source = Path(os.environ.get("LTFM_DATA", DEFAULT_SOURCE))
    work = Path(tempfile.mkdtemp(prefix="ltfm-bench-data-"))
    try:
        out = bench_data(args.data, source, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    p = out["prepare"]
    print(f"corpus: {out['pairs']:,} generated pairs ({out['train_pairs']:,} kept), {out['cpus']} CPUs, "
          f"load average before {out['load_average']} after {out['load_average_after']}")
    print(f"first prepare:            {p['wall_s']:>7.1f} s   peak RSS {p['peak_rss_mb'][0]} MB")
    print(f"prepared corpus on disk:  {out['cache_mb']:>7.1f} MB")
    for k in ("trial1", "trial2", "multi30k_trial"):
        r = out[k]
        print(f"{k + ':':<25} first step at {r['first_step_s']} s (whole run {r['wall_s']} s)   "
              f"peak RSS {r['peak_rss_mb'][0]} MB")
    print(f"RSS growth over Multi30k: {out['rss_growth_mb']} MB")
    if "ddp_trial" in out:
        r = out["ddp_trial"]
        print(f"2-process DDP:            first step at {r['first_step_s']} s   peak RSS per process "
              f"{r['peak_rss_mb']} MB   peak total PSS {r['peak_total_pss_mb']} MB")
    return 0
