"""``ltfm bench --layers``: the paper's Table 1 ("what a layer costs") measured on the machine at hand.

For each d_model and each sentence length n, one layer of each type is timed on a batch of ``bench.batch``
sentences of n positions:

* ``self-attention``: the model's own :class:`~lightning_tfm.model.MultiHeadAttention`, built from a
  :class:`~lightning_tfm.model.ModelConfig` (``bench.heads`` heads of d_model / heads), called as the encoder calls
  it (queries, keys and values from the same input; no padding mask, as every sentence has n positions), with Eq. 1
  computed by one kernel at every length (``--attention-kernel``, default ``matmul``: the full n x n scores; the
  model's ``auto`` would switch to SDPA past 128 keys, a kink inside the fitted range);
* ``gru`` and ``lstm``: one unidirectional ``torch.nn.GRU`` / ``torch.nn.LSTM`` layer of hidden size d_model (the
  recurrent baseline's cells);
* ``conv``: one ``torch.nn.Conv1d`` of kernel width k (``bench.kernel_width``) from d_model to d_model channels,
  the paper's convolutional row.

Two figures per layer: ``fwd+bwd``, the forward pass and the backward pass to the input and every weight
(``torch.autograd.grad``, so nothing accumulates between repetitions); ``step``, one decoding step without
gradients: for self-attention one new query against a cache of n keys and values (the model's
:class:`~lightning_tfm.model.KVCache` holding n - 1 earlier positions, the new one appended), for the recurrent
layers one cell step from a hidden state, for the convolution one output from the last k inputs. Times come from
``torch.utils.benchmark.Timer`` (its warm-up and repeats; ``blocked_autorange``), over ``bench.reps`` passes of the
whole grid: the figure is the best block over all passes, as other processes only ever add time (``layers.json`` and
``layers.csv`` also keep the median of the passes' medians).

Each series is summarised by its slope: least squares on log t against log n over the upper half of the lengths
(where fixed per-call costs matter least), printed beside the paper's complexity column and beside the slope of
the layer's forward FLOP count over the same lengths. The FLOP slope says what to expect at these sizes: a
self-attention layer also has its four d x d projections (8 n d^2 FLOPs beside the paper's 4 n^2 d for Eq. 1), so
its exponent of n rises from 1 towards the paper's 2 only as n passes d. The sequential operations are the paper's:
a recurrent layer's forward is n dependent cell steps, the other layers' one parallel operation each.

Writes ``layers.json`` (machine, settings, every timing), ``layers.csv``, and the figure ``layers.png`` / ``.svg``
(time against n, log-log, one line per layer type and d_model) to ``--out`` (default results/bench-layers).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from pathlib import Path

import torch
from torch import nn

from ..base.atomic import atomic_path, write_json, write_text
from ..base.errors import UserError
from ..model import KVCache, ModelConfig, MultiHeadAttention

#: The paper's Table 1 (per layer; n positions of width d, kernel width k): complexity, its exponent of n,
#: sequential operations, maximum path length.
PAPER = {"self-attention": ("O(n^2 d)", 2, "O(1)", "O(1)"),
         "recurrent": ("O(n d^2)", 1, "O(n)", "O(n)"),
         "convolutional": ("O(k n d^2)", 1, "O(1)", "O(log_k n)")}
#: layer type -> its row of the paper's table
KINDS = {"self-attention": "self-attention", "gru": "recurrent", "lstm": "recurrent", "conv": "convolutional"}
DEFAULT_D_MODELS = (128, 256)
DEFAULT_LENGTHS = (8, 16, 32, 64, 128, 256)
DEFAULT_OUT = "results/bench-layers"
#: ``bench.KEY=N`` settings of ``--layers``; threads 0: torch's own count (OMP_NUM_THREADS, else the cores)
SETTINGS = dict(batch=16, heads=4, kernel_width=3, threads=0, run_ms=200, reps=3)
#: each setting's (lowest, highest), and the largest --d-model and --lengths and how many of each: a grid whose
#: every layer can be built and timed (self-attention holds batch x heads x n^2 scores) in a bench that ends
RANGES = dict(batch=(1, 4096), heads=(1, 1024), kernel_width=(1, 1024), threads=(0, 4096), run_ms=(1, 60000),
              reps=(1, 100))
SIZES = {"--d-model": 8192, "--lengths": 8192}
MAX_SIZES = 32
MAX_SCORES = 2 ** 32  # batch x heads x n^2 attention scores at the longest length (16 GiB in fp32)
SETTING_HELP = {"batch": "sentences a batch", "heads": "attention heads", "kernel_width": "the convolution's k",
                "threads": "torch threads (0: torch's default)", "run_ms": "Timer's minimum run time a figure",
                "reps": "passes over the grid, each figure the best"}


# ------------------------------------------------------------------------------------------- arguments
def parse_sizes(text: str | None, option: str, default: tuple[int, ...]) -> list[int]:
    """A comma-separated list of positive integers (sorted, without repeats), or ``default``."""
    if text is None:
        return list(default)
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UserError(f"{option} {text!r}: give positive integers separated by commas, e.g. "
                        f"{option} {','.join(map(str, default[:3]))}")
    most = SIZES.get(option)
    if most is not None and (max(values) > most or len(set(values)) > MAX_SIZES):
        raise UserError(f"{option} {text[:60]!r}: give at most {MAX_SIZES} values from 1 to {most}")
    return sorted(set(values))


def parse_settings(overrides: list[str]) -> dict:
    """``bench.KEY=N`` overrides on :data:`SETTINGS`."""
    s = dict(SETTINGS)
    for o in overrides:
        key, eq, value = o.removeprefix("bench.").partition("=")
        if not o.startswith("bench.") or not eq or key not in SETTINGS:
            raise UserError(f"ltfm bench --layers takes bench.<name>=N settings, not {o!r}: keys are "
                            + ", ".join(f"{k} ({h})" for k, h in SETTING_HELP.items()))
        try:
            s[key] = int(value)
        except ValueError:
            raise UserError(f"bench.{key}={value!r} must be an integer") from None
        lo, hi = RANGES[key]
        if s[key] < lo:
            raise UserError(f"bench.{key}={value}: must be {'0 or more' if key == 'threads' else 'at least 1'}")
        if s[key] > hi:
            raise UserError(f"bench.{key}={value}: must be from {lo} to {hi}")
    return s


def check_out_dir(out: str) -> Path:
    """``--out`` must be a folder that exists or can be made, where the files :func:`write_outputs` writes can be
    written: checked before any timing by the check every command's output goes through
    (:func:`~lightning_tfm.base.atomic.check_writable`: names, a file in the way, /proc, read-only folders)."""
    from ..base.atomic import check_writable

    path = Path(out)
    check_writable(folders=[path])  # a file where the folder goes is named as such first
    check_writable(files=[path / f"layers.{ext}" for ext in ("json", "csv", "png", "svg")])
    return path


# ------------------------------------------------------------------------------------------- the layers
def build_layer(kind: str, d: int, s: dict, kernel: str = "matmul") -> nn.Module:
    torch.manual_seed(0)
    if kind == "self-attention":
        heads = s["heads"]
        return MultiHeadAttention(ModelConfig(d_model=d, heads=heads, d_k=d // heads, d_v=d // heads,
                                              attention_kernel=kernel))
    if kind == "gru":
        return nn.GRU(d, d, batch_first=True)
    if kind == "lstm":
        return nn.LSTM(d, d, batch_first=True)
    if kind == "conv":
        return nn.Conv1d(d, d, s["kernel_width"], padding="same")  # n outputs for any k
    raise ValueError(f"unknown layer type {kind!r}")


def _forward(kind: str, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if kind == "self-attention":
        return layer(x)
    if kind == "conv":
        return layer(x.transpose(1, 2)).transpose(1, 2)
    return layer(x)[0]


def make_fwd_bwd(kind: str, layer: nn.Module, d: int, n: int, batch: int, device: str = "cpu"):
    """Forward + backward over a batch of ``batch`` sentences of ``n`` positions: gradients of the input and of
    every weight."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(batch, n, d, generator=g).to(device).requires_grad_(True)
    grad_out = torch.randn(batch, n, d, generator=g).to(device)
    inputs = [x, *layer.parameters()]
    layer.train()

    def run():
        torch.autograd.grad(_forward(kind, layer, x), inputs, grad_out)
    return run


def make_step(kind: str, layer: nn.Module, d: int, n: int, batch: int, device: str = "cpu"):
    """One decoding step without gradients at position n (see the module docstring)."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(batch, 1, d, generator=g).to(device)
    layer.eval()
    if kind == "self-attention":
        # the keys and values of n - 1 earlier positions, as the model's cache holds them
        k, v = layer.project_kv(torch.randn(batch, n - 1, d, generator=g).to(device)) if n > 1 else (None, None)

        def run():
            cache = KVCache()
            cache.k, cache.v = k, v
            with torch.no_grad():
                layer(x, cache=cache)
        return run
    if kind == "conv":
        window = torch.randn(batch, d, layer.kernel_size[0], generator=g).to(device)  # the last k inputs

        def run():
            with torch.no_grad():
                nn.functional.conv1d(window, layer.weight, layer.bias)  # one output position, no padding
        return run
    h = torch.randn(1, batch, d, generator=g).to(device)
    state = (h, torch.zeros_like(h)) if kind == "lstm" else h

    def run():
        with torch.no_grad():
            layer(x, state)
    return run


def forward_flops(kind: str, n: int, d: int, k: int = 3) -> int:
    """Matrix-multiply FLOPs of one sentence's forward pass (2 a multiply-add): what the paper's complexity
    column counts, with the terms it leaves out."""
    if kind == "self-attention":
        return 8 * n * d * d + 4 * n * n * d  # Q, K, V and output projections; Q K^T and the weighted sum of V
    if kind == "gru":
        return 2 * n * 2 * 3 * d * d  # three gates, from the input and from the previous state
    if kind == "lstm":
        return 2 * n * 2 * 4 * d * d
    if kind == "conv":
        return 2 * n * k * d * d
    raise ValueError(kind)


# ------------------------------------------------------------------------------------------- measuring
def time_it(fn, threads: int, run_s: float) -> dict:
    """Seconds a call: ``torch.utils.benchmark.Timer``'s ``blocked_autorange``, the median and the best of its
    blocks."""
    from torch.utils.benchmark import Timer

    m = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads).blocked_autorange(min_run_time=run_s)
    return {"median_s": m.median, "best_s": min(m.times)}


def upper_half(lengths: list[int]) -> list[int]:
    """The lengths the slope is fitted on: the upper half (at least two)."""
    return sorted(lengths)[-max(2, math.ceil(len(lengths) / 2)):]


def fit_slope(ns: list[float], ts: list[float]) -> float | None:
    """Least-squares slope of log t against log n over the upper half of ``ns``: t ~ n^slope. None under two
    distinct lengths."""
    import numpy as np

    pairs = dict(zip(ns, ts))
    top = upper_half(list(pairs))
    if len(top) < 2:
        return None
    return float(np.polyfit(np.log([float(n) for n in top]), np.log([float(pairs[n]) for n in top]), 1)[0])


def run_layers(d_models: list[int], lengths: list[int], settings: dict | None = None, kernel: str = "matmul",
               kinds: tuple[str, ...] = tuple(KINDS), device: str = "cpu", log=print) -> dict:
    """Every layer type at every d_model and length: timings, fitted slopes and the machine."""
    from .speed import cpu_name

    s = {**SETTINGS, **(settings or {})}
    bad = [d for d in d_models if d % s["heads"]]
    if bad:
        raise UserError(f"--d-model {bad[0]} is not a multiple of bench.heads={s['heads']}: give widths the heads "
                        "divide, or set bench.heads")
    threads = s["threads"] or torch.get_num_threads()
    load_before = [round(x, 2) for x in os.getloadavg()]
    layers = {(kind, d): build_layer(kind, d, s, kernel).to(device) for d in d_models for kind in kinds}
    times: dict[tuple, dict[str, list[float]]] = {}
    # Passes over the whole grid, each figure the best of its passes: a burst of load on a shared machine then
    # spoils one pass at one length, not a length's every figure.
    for rep in range(s["reps"]):
        for d in d_models:
            for n in lengths:
                for kind in kinds:
                    t = times.setdefault((kind, d, n), {"fb": [], "st": [], "fb_median": [], "st_median": []})
                    for key, make in (("fb", make_fwd_bwd), ("st", make_step)):
                        m = time_it(make(kind, layers[kind, d], d, n, s["batch"], device), threads, s["run_ms"] / 1e3)
                        t[key].append(m["best_s"] * 1e3)
                        t[key + "_median"].append(m["median_s"] * 1e3)
                log(f"pass {rep + 1}/{s['reps']}, d_model {d}, n {n}: " + ", ".join(
                    f"{kind} {times[kind, d, n]['fb'][-1]:.3g} ms" for kind in kinds))
    rows = [{"layer": kind, "d_model": d, "n": n, "fwd_bwd_ms": min(t["fb"]), "step_ms": min(t["st"]),
             "fwd_bwd_median_ms": statistics.median(t["fb_median"]),
             "step_median_ms": statistics.median(t["st_median"]),
             "sequential_ops": n if KINDS[kind] == "recurrent" else 1,
             "forward_gflop": forward_flops(kind, n, d, s["kernel_width"]) * s["batch"] / 1e9}
            for (kind, d, n), t in sorted(times.items(), key=lambda x: (x[0][1], x[0][2], list(KINDS).index(x[0][0])))]
    return {"rows": rows, "slopes": slopes(rows, kinds, d_models, s["kernel_width"]), "settings": s,
            "attention_kernel": kernel, "d_models": d_models, "lengths": lengths, "fit_lengths": upper_half(lengths),
            "device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_name(),
            "cores": os.cpu_count(), "threads": threads, "torch": torch.__version__, "loadavg_before": load_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def slopes(rows: list[dict], kinds, d_models, k: int) -> list[dict]:
    out = []
    for kind in kinds:
        complexity, exponent, sequential, path = PAPER[KINDS[kind]]
        for d in d_models:
            mine = sorted((r for r in rows if r["layer"] == kind and r["d_model"] == d), key=lambda r: r["n"])
            ns = [r["n"] for r in mine]
            out.append({"layer": kind, "d_model": d, "fwd_bwd_slope": fit_slope(ns, [r["fwd_bwd_ms"] for r in mine]),
                        "step_slope": fit_slope(ns, [r["step_ms"] for r in mine]),
                        "flop_slope": fit_slope(ns, [forward_flops(kind, n, d, k) for n in ns]),
                        "paper_complexity": complexity, "paper_exponent": exponent,
                        "paper_sequential_ops": sequential, "paper_path_length": path})
    return out


# ------------------------------------------------------------------------------------------- output
def _slope(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def format_report(r: dict) -> str:
    s = r["settings"]
    kinds = list(dict.fromkeys(row["layer"] for row in r["rows"]))
    lines = [f"one layer, batch {s['batch']} sentences of n positions, fp32; self-attention: {s['heads']} heads, "
             f"{r['attention_kernel']} kernel; conv k={s['kernel_width']}; {r['device']} ({r['device_name']}), "
             f"{r['cores']} cores, {r['threads']} threads, torch {r['torch']}; load average "
             f"{r['loadavg_before'][0]:.2f} before, {r['loadavg_after'][0]:.2f} after",
             f"times in ms (Timer's best block over {s['reps']} passes): fwd+bwd = forward and backward over the "
             "batch; step = one decoding step",
             ""]
    head = f"{'d_model':>7s} {'n':>5s}" + "".join(f" | {'fwd+bwd':>9s} {'step':>7s}" for k in kinds)
    lines += [" " * 13 + "".join(f" | {k:^17s}" for k in kinds), head, "-" * len(head)]
    for d in r["d_models"]:
        for n in r["lengths"]:
            cells = {row["layer"]: row for row in r["rows"] if row["d_model"] == d and row["n"] == n}
            lines.append(f"{d:7d} {n:5d}" + "".join(
                f" | {cells[k]['fwd_bwd_ms']:9.3f} {cells[k]['step_ms']:7.3f}" for k in kinds))
    fit = ",".join(map(str, r["fit_lengths"]))
    lines += ["", f"slopes: least squares on log t against log n over n = {fit}; paper: Vaswani et al. (2017), Table 1",
              f"{'layer':15s} {'d_model':>7s} {'fwd+bwd':>8s} {'FLOPs':>6s} {'step':>6s}   {'paper':11s} "
              f"{'sequential ops':>16s} {'path':>10s}"]
    n_max = max(r["lengths"])
    for x in r["slopes"]:
        seq = f"{x['paper_sequential_ops']}: {n_max if x['paper_sequential_ops'] == 'O(n)' else 1} at {n_max}"
        lines.append(f"{x['layer']:15s} {x['d_model']:7d} {_slope(x['fwd_bwd_slope']):>8s} "
                     f"{_slope(x['flop_slope']):>6s} {_slope(x['step_slope']):>6s}   {x['paper_complexity']:11s} "
                     f"{seq:>16s} {x['paper_path_length']:>10s}")
    lines.append("fwd+bwd: the measured exponent of n; FLOPs: the exponent of the layer's forward FLOP count over the "
                 "same n (self-attention adds 8 n d^2 of projections to the paper's n^2 d); a recurrent layer's "
                 "forward is n dependent cell steps, the others' one parallel operation")
    return "\n".join(lines)


def to_csv(r: dict) -> str:
    buf = io.StringIO()
    fields = list(r["rows"][0])
    w = csv.DictWriter(buf, fields, lineterminator="\n")
    w.writeheader()
    for row in r["rows"]:
        w.writerow({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()})
    return buf.getvalue()


STYLE = {"self-attention": "tab:blue", "gru": "tab:red", "lstm": "tab:orange", "conv": "tab:green"}


def plot(r: dict):
    """Time against n, log-log: fwd+bwd (left) and one decoding step (right); one line per layer type (colour)
    and d_model (line style), each labelled with its fitted slope; dotted guides of slope 1 and 2 (0 and 1 for
    the step)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(12, 5), dpi=100, layout="constrained")
    axes = fig.subplots(1, 2)
    dashes = ["-", "--", ":", "-."]
    for ax, key, skey, title, guides in ((axes[0], "fwd_bwd_ms", "fwd_bwd_slope", "forward + backward, one layer",
                                          (1, 2)),
                                         (axes[1], "step_ms", "step_slope", "one decoding step", (0, 1))):
        for x in r["slopes"]:
            mine = sorted((row for row in r["rows"] if row["layer"] == x["layer"] and row["d_model"] == x["d_model"]),
                          key=lambda row: row["n"])
            ax.plot([row["n"] for row in mine], [row[key] for row in mine], marker="o", markersize=3,
                    color=STYLE.get(x["layer"]), linestyle=dashes[r["d_models"].index(x["d_model"]) % len(dashes)],
                    label=f"{x['layer']}, d {x['d_model']}: slope {_slope(x[skey])}")
        ns = r["lengths"]
        t0 = min(row[key] for row in r["rows"])
        for p in guides:
            ax.plot(ns, [t0 * (n / ns[0]) ** p for n in ns], color="grey", linestyle=":", linewidth=0.8)
            ax.annotate(f"n^{p}", (ns[-1], t0 * (ns[-1] / ns[0]) ** p), fontsize=8, color="grey")
        ax.set(xscale="log", yscale="log", xlabel="sentence length n", ylabel="ms", title=title)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xticks([], minor=True)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=7)
    fig.suptitle(f"Table 1 measured: {r['device_name']}, {r['threads']} threads, batch {r['settings']['batch']}; "
                 f"slopes over n = {','.join(map(str, r['fit_lengths']))} (paper: self-attention n^2 d, "
                 "recurrent n d^2, convolutional k n d^2)", fontsize=9)
    for text in fig.texts + [t for ax in axes for t in ax.texts]:
        text.set_parse_math(False)
    return fig


def write_outputs(r: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_json(out / "layers.json", r), write_text(out / "layers.csv", to_csv(r))]
    fig = plot(r)
    for fmt in ("png", "svg"):
        with atomic_path(out / f"layers.{fmt}") as tmp:
            fig.savefig(tmp, format=fmt, metadata={"Software": None} if fmt == "png" else {"Date": None})
        paths.append(out / f"layers.{fmt}")
    return paths


def bench_layers_cli(args) -> int:
    """``ltfm bench --layers [--d-model 128,256] [--lengths 8,...,256] [--out DIR] [bench.KEY=N ...]``."""
    for option, given in (("--vs", args.vs != "none"), ("--data", args.data is not None),
                          ("--config", args.config), ("--dtypes", args.dtypes)):
        if given:
            raise UserError(f"{option} does not apply to --layers (one layer of each type, fp32): leave it out")
    d_models = parse_sizes(args.d_model, "--d-model", DEFAULT_D_MODELS)
    lengths = parse_sizes(args.lengths, "--lengths", DEFAULT_LENGTHS)
    settings = parse_settings(args.overrides)
    if settings["batch"] * settings["heads"] * max(lengths) ** 2 > MAX_SCORES:
        raise UserError(f"--lengths up to {max(lengths)} with bench.batch={settings['batch']} and bench.heads="
                        f"{settings['heads']}: the self-attention's batch x heads x n^2 scores pass {MAX_SCORES}: "
                        "give shorter lengths or a smaller batch")
    out = check_out_dir(args.out or DEFAULT_OUT)
    from .speed import default_device

    device = default_device() if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA GPU here: use --device cpu")
    quiet = args.json
    r = run_layers(d_models, lengths, settings, args.attention_kernel or "matmul", device=device,
                   log=(lambda *a: None) if quiet else (lambda m: print(m, flush=True)))
    paths = write_outputs(r, out)
    print(json.dumps(r, indent=2) if quiet else format_report(r))
    if not quiet:
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0
