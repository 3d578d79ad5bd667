"""``ltfm bench``: training and decoding speed of our Transformer, optionally beside Hugging Face's
MarianMTModel (the same post-norm, sinusoidal, shared-embedding design) at the same shapes; or of any
architecture an experiment builds (``ltfm bench EXPERIMENT.yaml``, or ``--config``: ``model.arch: rnn`` measures
the recurrent baseline at its ``rnn.*`` shapes, alone).

Both models are built in one process with the same N, d_model, d_ff, heads, vocabulary, batch and dtype,
and measured alternately (ours, Marian, ours, Marian, ...) so that a busy machine slows both alike; the
best repetition of each is reported (with the load average, since other processes slow the absolute
figures). On a CPU it measures at one thread (what a sweep's trial trains on) and then at torch's default (every
core), one table each (``--json``: a list of the two results), unless ``bench.threads=N`` names one count.
Figures per model and dtype:

* ``train_tokens_per_s``: target tokens per second of forward + label-smoothed loss + backward + Adam step
  (see ``make_train_step``);
* ``decode_sentences_per_s``: beam-4 decoding, every sentence generating exactly ``bench.out_len`` tokens
  and then EOS (random weights would otherwise stop at random lengths: both models are held to the same
  work): ours with ``min_len = max_len = out_len``, Marian's ``generate`` with ``min_new_tokens=out_len``,
  ``max_new_tokens=out_len + 1`` and EOS forced at the maximum length (checked after every run);
* ``peak_memory_mb``: on CUDA the allocator's peak (``torch.cuda.max_memory_allocated``) over the
  measurement; on CPU the largest growth of the process's resident memory, after free pages are returned
  to the OS (sampled every 2 ms);
* ``mfu``: model FLOPs per second of training (6 x matmul parameters x tokens, plus attention: the architecture's
  own ``train_flops_per_token``, model/transformer.py, model/rnn.py) over the device's measured matrix-multiply
  peak in that dtype (a large product timed in every repetition, the best of all: steps and peak both at the
  machine's best).

The process's memory as ``ltfm train``'s: freed blocks kept for the next step (base/memory.py).

``--device`` (default: cuda when torch sees a GPU, else cpu) puts both models, the batches and the peak
measurement on that device; on CUDA every timed region ends with a synchronize.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import threading
import time

import torch

from ..base.errors import UserError
from ..base.knobs import check_of
from ..base.memory import keep_freed_memory
from ..model import DEFAULT_ARCH, ModelConfig, build_model, registry
from ..model.config import MAX_POSITIONS
from ..training.config.sections import DataConfig, DecodeConfig

DEFAULTS = dict(layers=3, d_model=256, d_ff=1024, heads=4, vocab=8000, batch=128, src_len=20, tgt_len=20,
                out_len=20, beam=4, reps=3, train_steps=4, decode_batches=1, threads=0)  # threads 0: torch's default
SHAPES = ("layers", "d_model", "d_ff", "heads")  # the settings that shape the transformer (model_config)
#: Each setting's (lowest, highest): the highest far above a bench of the paper's models, below a model or batch
#: that cannot be allocated or a measurement that would not end (bench.batch=0 measured nothing and divided by 0)
RANGES = dict(**{k: check_of(ModelConfig, k).bounds for k in SHAPES}, vocab=check_of(DataConfig, "vocab_size").bounds,
              batch=(1, 65536), src_len=(1, MAX_POSITIONS), tgt_len=(1, MAX_POSITIONS), out_len=(1, MAX_POSITIONS),
              beam=check_of(DecodeConfig, "beam_size").bounds, reps=(1, 100), train_steps=(1, 10000),
              decode_batches=(1, 10000), threads=(0, 4096))  # a model's sizes, the vocabulary, the beam: the config's
MARIAN_POSITIONS = 512  # build_marian's max_position_embeddings
#: transformers is the bench extra's alone (not in the dev extra either: where it is installed, every import of
#: Lightning imports it, through torchmetrics)
MARIAN_NEEDS = ("--vs marian needs Hugging Face transformers, the bench extra: pip install -e '.[bench]' (make bench "
                "installs it and runs the Marian comparison)")


def check_settings(s: dict, model_cfg: ModelConfig | None = None, vs: str = "none") -> None:
    """Every setting within its range, and the sentences within the model's positions (BOS or EOS included, an
    output's EOS too; Marian's too with ``vs``): one line naming the setting and its range."""
    for key, (lo, hi) in RANGES.items():
        if not lo <= s[key] <= hi:
            raise UserError(f"bench.{key}={s[key]} must be from {lo} to {hi}")
    positions = getattr(registry.arch_config(model_cfg or model_config(s)), "max_positions", MAX_POSITIONS)
    positions = min(positions, MARIAN_POSITIONS) if vs == "marian" else positions
    for key, most in (("src_len", positions - 1), ("tgt_len", positions - 1), ("out_len", positions - 2)):
        if s[key] > most:
            raise UserError(f"bench.{key}={s[key]} does not fit the model's {positions} positions (BOS or EOS "
                            f"included): give at most {most}")
    # after the settings: a setting out of range is the user's to fix whether or not the extra is installed
    if vs == "marian" and importlib.util.find_spec("transformers") is None:
        raise UserError(MARIAN_NEEDS)


# ------------------------------------------------------------------------------------------- measuring
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else ``"cpu"``: the device name every benchmark records."""
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "cpu"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _release_free_memory() -> None:
    """Hand the allocator's free pages back to the OS (glibc's malloc_trim), so that the next block's
    working set shows as growth of resident memory instead of reusing pages freed earlier."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the figure is then a lower bound
        pass


class PeakMemory:
    """Peak memory (MB) while the block runs: the CUDA allocator's peak on ``cuda``, else the growth of the
    process's resident memory."""

    def __init__(self, device: str = "cpu"):
        self.device = device

    def __enter__(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return self
        _release_free_memory()
        self.base = self.peak = _rss_mb()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()
        return self

    def _watch(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb())
            time.sleep(0.002)

    def __exit__(self, *exc):
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.mb = torch.cuda.max_memory_allocated() / 2**20
            return
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss_mb())
        self.mb = self.peak - self.base


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_peak_flops(dtype: torch.dtype, n: int | None = None, reps: int = 10, device: str = "cpu") -> float:
    """Measured FLOP/s of a large square matrix product in ``dtype`` on ``device`` (best of ``reps``; on
    CUDA 8192 x 8192 and a batch of products per timing, so launch gaps do not count)."""
    n = n or (8192 if device == "cuda" else 2048)
    inner = 10 if device == "cuda" else 1
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            a @ b
        _sync(device)
        best = min(best, (time.perf_counter() - t) / inner)
    return 2 * n**3 / best


# -------------------------------------------------------------------------------------------- the models
def model_config(s: dict) -> ModelConfig:
    """Our model at the settings' shapes: heads of d_model / heads, the paper's other defaults."""
    head = s["d_model"] // s["heads"]
    return ModelConfig(layers=s["layers"], d_model=s["d_model"], d_ff=s["d_ff"], heads=s["heads"], d_k=head, d_v=head,
                       dropout=0.1)


def build_ours(s: dict, model_cfg: ModelConfig | None = None):
    """Our model: ``model_cfg``'s architecture (an experiment's model section), else the transformer of
    :func:`model_config`."""
    torch.manual_seed(0)
    return build_model(model_cfg or model_config(s), s["vocab"])


def shape_text(s: dict, model_cfg: ModelConfig | None = None) -> str:
    """The measured model's shapes in a few words (the report's first line)."""
    if model_cfg is None or model_cfg.arch == DEFAULT_ARCH:
        return f"N={s['layers']} d_model={s['d_model']} d_ff={s['d_ff']} heads={s['heads']}"
    return f"{model_cfg.arch}: " + registry.entry(model_cfg).cls.describe(registry.arch_config(model_cfg))


def build_marian(s: dict):
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        raise UserError(MARIAN_NEEDS) from None
    from ..model import EOS, PAD

    torch.manual_seed(0)
    cfg = MarianConfig(vocab_size=s["vocab"], d_model=s["d_model"], encoder_layers=s["layers"],
                       decoder_layers=s["layers"], encoder_attention_heads=s["heads"],
                       decoder_attention_heads=s["heads"], encoder_ffn_dim=s["d_ff"], decoder_ffn_dim=s["d_ff"],
                       activation_function="relu", scale_embedding=True, dropout=0.1, attention_dropout=0.0,
                       activation_dropout=0.0, max_position_embeddings=MARIAN_POSITIONS, pad_token_id=PAD,
                       eos_token_id=EOS, decoder_start_token_id=PAD, forced_eos_token_id=EOS,
                       share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    return MarianMTModel(cfg)


def _batch(s: dict, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, s["vocab"], (s["batch"], s["src_len"]), generator=g).to(device)
    tgt = torch.randint(4, s["vocab"], (s["batch"], s["tgt_len"] + 1), generator=g).to(device)
    return src, tgt[:, :-1], tgt[:, 1:]


def _autocast(dtype, device: str = "cpu"):
    return torch.autocast(device, dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()


def make_train_step(kind: str, model, s: dict, dtype: str, device: str = "cpu"):
    """One training step as ``ltfm train`` runs it: ours with the fused projection + smoothed loss
    (loss.fused_label_smoothed_nll_loss); Marian through its logits and the same smoothed loss.
    Both use the same (fused) Adam."""
    from ..training.loss import fused_label_smoothed_nll_loss, label_smoothed_nll_loss
    from ..training.optim import adam

    src, tgt_in, tgt_out = _batch(s, device=device)
    opt = adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    mask = torch.ones_like(src)

    def step():
        with _autocast(dtype, device):
            if kind == "ours":
                loss, _, n = fused_label_smoothed_nll_loss(model.features(src, tgt_in), model.output_weight,
                                                           tgt_out, 0.1)
            else:
                logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt_in).logits
        if kind != "ours":
            loss, _, n = label_smoothed_nll_loss(logits, tgt_out, 0.1)
        (loss / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def make_decode(kind: str, model, s: dict, dtype: str, device: str = "cpu"):
    from ..training.decode import translate_ids

    src, _, _ = _batch(s, seed=1, device=device)
    n = s["out_len"]
    if kind == "ours":
        ids = src.tolist()

        def run():
            out = translate_ids(model, ids, beam_size=s["beam"], alpha=0.6, max_len_a=0.0, max_len_b=n,
                                batch_sentences=s["batch"], dtype=torch.bfloat16 if dtype == "bf16" else None,
                                min_len=n, device=torch.device(device))
            assert all(len(h.tokens) == n for h in out)
        return run

    from ..model import EOS

    mask = torch.ones_like(src)

    def run():
        # no_grad as generate() itself uses (and as our decoding does): under inference_mode autocast would
        # recast every weight at every step, which would slow Marian down unfairly.
        with torch.no_grad(), _autocast(dtype, device):
            out = model.generate(input_ids=src, attention_mask=mask, num_beams=s["beam"], length_penalty=0.6,
                                 min_new_tokens=n, max_new_tokens=n + 1, early_stopping=True, do_sample=False)
        # decoder start token + n tokens + EOS, like ours (n tokens, then EOS forced at the maximum length)
        assert out.shape[1] == n + 2 and bool((out[:, -1] == EOS).all()) and not bool((out[:, 1:-1] == EOS).any())
    return run


def _time(fn, k: int, device: str = "cpu") -> float:
    fn()  # warm-up
    _sync(device)
    t = time.perf_counter()
    for _ in range(k):
        fn()
    _sync(device)
    return (time.perf_counter() - t) / k


def _measure(into: dict, what: str, fn, k: int, device: str) -> None:
    """One measurement of ``what`` (train, decode): the seconds a call of ``fn`` takes (:func:`_time`, ``k`` calls)
    appended to ``into[what]``, its peak memory to ``into[what + "_mem"]``."""
    with PeakMemory(device) as pm:
        sec = _time(fn, k, device)
    into[what].append(sec)
    into[f"{what}_mem"].append(pm.mb)


DTYPES = ("fp32", "bf16")
PEAK_REPS = 4  # large products timed in each repetition of run_bench (the best of all repetitions is the peak)


def default_dtypes(device: str = "cpu") -> tuple[str, ...]:
    """fp32, and bf16 where the device multiplies bf16 natively (a CPU without it runs bf16 many times
    slower than fp32: precision.py)."""
    from ..training.precision import cpu_has_fast_bf16

    native = torch.cuda.is_bf16_supported() if device == "cuda" else cpu_has_fast_bf16()
    return DTYPES if native else ("fp32",)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_bench(settings: dict | None = None, vs: str = "none", dtypes=None, log=print, device: str = "cpu",
              model_cfg: ModelConfig | None = None) -> dict:
    """Measure our model (``model_cfg``'s architecture, else the settings' transformer) and, with ``vs="marian"``,
    Marian at the same shapes (a transformer only)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA GPU here (torch.cuda.is_available() is False): "
                        "use --device cpu")
    if dtypes is None:
        dtypes = default_dtypes(device)
        if "bf16" not in dtypes:
            log(f"ltfm bench: this {device} has no native bf16: bf16 is left out, fp32 only")

    s = {**DEFAULTS, **(settings or {})}
    check_settings(s, model_cfg, vs)
    load_before = [round(x, 2) for x in os.getloadavg()]
    if s["threads"]:
        torch.set_num_threads(s["threads"])
    keep_freed_memory()  # as ltfm train's process does (both models alike)
    kinds = ["ours"] + (["marian"] if vs == "marian" else [])
    models = {"ours": build_ours(s, model_cfg).to(device)}
    if vs == "marian":
        models["marian"] = build_marian(s).to(device)
    peaks = dict.fromkeys(dtypes, 0.0)
    # the architecture's own count, per target token -> per step of batch x tgt_len target tokens
    flops = registry.train_flops_per_step(model_cfg or model_config(s), s["vocab"], (s["src_len"], s["tgt_len"]),
                                          s["batch"] * s["tgt_len"])
    res = {k: {dt: {"train": [], "decode": [], "train_mem": [], "decode_mem": []} for dt in dtypes} for k in kinds}
    for rep in range(s["reps"]):
        for dt in dtypes:
            # the peak within each repetition, its best over all: a machine whose speed drifts (a shared host) is
            # measured at its best for the products as for the steps, not at one moment for the peak
            peaks[dt] = max(peaks[dt], matmul_peak_flops(torch.float32 if dt == "fp32" else torch.bfloat16,
                                                         reps=PEAK_REPS, device=device))
            for kind in kinds:  # alternate the models within each repetition
                m = models[kind]
                m.train()
                _measure(res[kind][dt], "train", make_train_step(kind, m, s, dt, device), s["train_steps"], device)
                m.eval()
                _measure(res[kind][dt], "decode", make_decode(kind, m, s, dt, device), s["decode_batches"], device)
                log(f"rep {rep + 1}/{s['reps']} {kind:6s} {dt}: "
                    f"train {s['batch'] * s['tgt_len'] / res[kind][dt]['train'][-1]:8.0f} tok/s"
                    f"  decode {s['batch'] / res[kind][dt]['decode'][-1]:6.1f} sent/s")
    out = {"settings": s, "arch": model_cfg.arch if model_cfg else DEFAULT_ARCH, "model": shape_text(s, model_cfg),
           "matmul_peak_gflops": {dt: round(p / 1e9, 1) for dt, p in peaks.items()},
           "torch": torch.__version__, "dtypes": list(dtypes), "device": device,
           "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_name(),
           "threads": torch.get_num_threads(), "attention_kernel": getattr(models["ours"], "attention_kernel", None),
           # other processes slow both models alike (alternation), but the absolute figures too: say so
           "loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    for kind in kinds:
        out[kind] = {}
        for dt in dtypes:
            r = res[kind][dt]
            best_train, best_dec = min(r["train"]), min(r["decode"])
            out[kind][dt] = {
                "train_tokens_per_s": round(s["batch"] * s["tgt_len"] / best_train, 1),
                "decode_sentences_per_s": round(s["batch"] / best_dec, 1),
                "peak_memory_mb": round(max(max(r["train_mem"]), max(r["decode_mem"])), 1),
                "mfu": round(flops / best_train / peaks[dt], 4),
                "train_s_per_step_all_reps": [round(x, 4) for x in r["train"]],
                "decode_s_all_reps": [round(x, 4) for x in r["decode"]],
            }
    if vs == "marian":
        ours, marian = out["ours"], out["marian"]
        out["speedup"] = {dt: {"train": round(ours[dt]["train_tokens_per_s"] / marian[dt]["train_tokens_per_s"], 2),
                               "decode": round(ours[dt]["decode_sentences_per_s"]
                                               / marian[dt]["decode_sentences_per_s"], 2)}
                          for dt in dtypes}
    return out


def format_report(r: dict) -> str:
    s = r["settings"]
    lines = [f"{r.get('model') or shape_text(s)} vocab={s['vocab']} "
             f"batch={s['batch']}x{s['src_len']} tokens, beam {s['beam']}, {s['out_len']} output tokens; "
             f"{r.get('device', 'cpu')} ({r.get('device_name', '?')}), torch {r['torch']}, {r['threads']} threads; "
             "matmul peak "
             + ", ".join(f"{dt} {g:.0f} GFLOP/s" for dt, g in r["matmul_peak_gflops"].items())
             + f"; load average {r['loadavg_before'][0]:.2f} before, {r['loadavg_after'][0]:.2f} after",
             f"{'model':8s} {'dtype':5s} {'train tok/s':>12s} {'decode sent/s':>14s} {'peak MB':>8s} {'MFU':>6s}"]
    for kind in ("ours", "marian"):
        for dt, v in r.get(kind, {}).items():
            lines.append(f"{kind:8s} {dt:5s} {v['train_tokens_per_s']:12.0f} {v['decode_sentences_per_s']:14.1f} "
                         f"{v['peak_memory_mb']:8.0f} {v['mfu']:6.1%}")
    for dt, sp in r.get("speedup", {}).items():
        lines.append(f"ours / marian, {dt}: training {sp['train']:.2f}x, decoding {sp['decode']:.2f}x")
    return "\n".join(lines)


def bench_speed_cli(args) -> int:
    """``ltfm bench [EXPERIMENT.yaml | --config EXPERIMENT.yaml] [bench.KEY=N ...] [dotted.key=value ...]``: an
    experiment gives the model (its architecture and shapes: a transformer's become the bench.* shapes, so Marian
    can be built beside it; any other architecture is measured as its config builds it) and its vocabulary."""
    settings, model_cfg, overrides, experiment = {}, None, list(args.overrides), args.config
    if experiment is None and overrides and overrides[0].endswith((".yaml", ".yml")):
        experiment = overrides.pop(0)  # ltfm bench EXPERIMENT.yaml: as --config
    stray = [o for o in overrides if not o.startswith("bench.")]
    if stray and not experiment:
        raise UserError(f"{stray[0]!r} is not a bench.<name>=N setting: config overrides go with an experiment "
                        f"(ltfm bench EXPERIMENT.yaml {stray[0]}), or drop it")
    for o in overrides:
        if o.startswith("bench."):
            key, _, value = o[len("bench."):].partition("=")
            if key not in DEFAULTS:
                raise UserError(f"unknown bench setting {key!r}: use one of {', '.join(DEFAULTS)}")
            try:
                settings[key] = int(value)
            except ValueError:
                raise UserError(f"bench.{key}={value!r} must be an integer") from None
    if experiment:
        from ..training.config.config import load_config

        cfg = load_config(experiment, stray + ([] if any(o.startswith("data.path") for o in stray)
                                               else ["data.path=unused"]))
        m = cfg.model
        settings.setdefault("vocab", cfg.data.vocab_size)
        if m.arch == DEFAULT_ARCH:
            settings = {"layers": m.layers, "d_model": m.d_model, "d_ff": m.d_ff, "heads": m.heads, **settings}
        else:
            shaped = [k for k in SHAPES if k in settings]
            if args.vs == "marian" or shaped:
                what = f"bench.{shaped[0]} does" if shaped else "--vs marian (a transformer) does"
                raise UserError(f"{what} not apply to {experiment}'s model.arch={m.arch}: drop it (its shapes are "
                                f"its {m.arch}.* keys, e.g. {m.arch}.dec_hidden=256 after the experiment)")
            model_cfg = m
    dtypes = None
    if args.dtypes:
        dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
        if not dtypes or any(d not in DTYPES for d in dtypes):
            raise UserError(f"--dtypes {args.dtypes!r}: give a comma-separated list of fp32 and bf16")
    device = default_device() if args.device == "auto" else args.device
    counts = ([settings.get("threads", DEFAULTS["threads"])] if "threads" in settings or device != "cpu"
              else default_threads())
    runs = []
    for n in counts:  # one thread first: what a sweep's trial trains on (one worker per core)
        runs.append(run_bench({**settings, "threads": n}, args.vs, dtypes=dtypes,
                              log=(lambda *a: None) if args.json else (lambda m: print(m, flush=True)),
                              device=device, model_cfg=model_cfg))
        if not args.json:
            print(format_report(runs[-1]), flush=True)
    if args.json:
        print(json.dumps(runs[0] if len(runs) == 1 else runs, indent=2))
    return 0


def default_threads() -> list[int]:
    """The thread counts ``ltfm bench`` measures on a CPU when ``bench.threads`` is not given: 1 (a sweep's trial,
    one per core) and torch's default (every core), once each."""
    return sorted({1, torch.get_num_threads()})
