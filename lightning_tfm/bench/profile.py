"""``ltfm bench --config EXPERIMENT.yaml --profile``: where a real trial's time goes, at the threads it trains on.

A trial of the experiment (``ltfm train``'s own code, the overrides given after it; 300 steps unless
``train.max_steps`` is given) is run twice, each into a fresh temporary results folder:

* **the phases**, without a profiler: start-up (the imports of a fresh ``ltfm`` process and of Lightning, each in
  a subprocess of its own), the in-process set-up before the first step (the prepared corpus read, the model and
  the Trainer built), the training steps (``on_train_batch_start`` to ``on_train_batch_end``: forward, loss,
  backward, optimizer step and Lightning's hooks around them), what lies between two steps (the next batch's
  collation and Lightning's loop), the checkpoint writes, the validations and the closing evaluation (the BLEU
  decode of the dev set, the summary); wall clock seconds;
* **the training step by kind of work**, under torch.profiler: the CPU time of every aten operator inside the
  steps, attributed to the module it ran in (forward hooks label each module; a backward operator goes with the
  forward operator whose autograd node it runs, by sequence number): matrix products, layer norms, dropout,
  residual adds, attention's softmax and masks, the embedding's gather and scatter, the loss, Adam, autograd's
  gradient accumulation, and the step's time outside any operator (Python, autograd's engine, Lightning). The
  profiler costs time of its own (a few microseconds an operator), so this table is read as shares of the
  profiled step; the phases' seconds are those of the run without it;
* **the products' ceiling**: the step's matrix products' FLOPs (the profiler's count from their shapes) over their own
  time, against a large square product's rate measured after the trials (the peak MFU is measured against): the
  MFU a step would reach were everything but its products free, beside the step's own.

Nothing here is imported by a training run.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import torch

from ..base.errors import UserError

DEFAULT_STEPS = 300
LABEL = "ltfm#"  # the prefix of this module's record_function labels
STEP = LABEL + "step"
LOSS = LABEL + "loss"
MODEL = LABEL + "model"
TRAINING_STEP = LABEL + "training_step"
BACKWARD = "autograd::engine::evaluate_function: "
MATMUL_OPS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::matmul", "aten::linear",
              "aten::_addmm_activation", "aten::mv", "aten::addmv", "aten::dot"}
#: what each labelled module's own operators are (operators of its labelled children go to theirs)
MODULE_KINDS = {"Linear": "linear", "LayerNorm": "layer norm", "FastDropout": "dropout", "Dropout": "dropout",
                "Residual": "residual add", "MultiHeadAttention": "attention: softmax, mask, head reshapes",
                "FeedForward": "feed-forward activation (ReLU)", "Embedding": "embedding gather / scatter",
                "model": "embedding scale, positions, masks"}  # "model": the model's own operators (its features)
#: the training step's rows, in the table's order
STEP_KINDS = ("matrix products (model)", "loss: vocabulary projection products", "loss: softmax, smoothing, sums",
              "layer norm", "dropout", "residual add", "attention: softmax, mask, head reshapes",
              "feed-forward activation (ReLU)", "embedding gather / scatter", "embedding scale, positions, masks",
              "optimizer step (Adam)", "zero_grad", "autograd: gradient accumulation", "other operators in the step",
              "outside operators: Python, autograd engine, Lightning")
PRODUCT_KINDS = ("matrix products (model)", "loss: vocabulary projection products")


@dataclass
class Phases:
    """Wall-clock seconds of one trial's phases (the run without a profiler)."""
    steps: int
    import_ltfm_s: float  # `import lightning_tfm.training.train` (torch, the config) in a fresh interpreter
    import_lightning_s: float  # `import lightning_tfm.training.lit` (Lightning) in a fresh interpreter
    setup_s: float  # train() called -> the first training step (corpus read, model, Trainer)
    train_steps_s: float
    between_steps_s: float  # the next batch's collation and Lightning's loop
    checkpoints_s: float
    validation_s: float
    validations: int
    closing_s: float  # the end of fitting -> train() returned: the closing evaluation (BLEU), the summary
    total_s: float  # train() called -> returned

    @property
    def step_ms(self) -> float:
        return 1000 * self.train_steps_s / max(self.steps, 1)


@dataclass
class StepProfile:
    """The training step's CPU time by kind of work (the profiled run), milliseconds per step."""
    steps: int
    step_ms: float  # the profiled step's wall time
    ms_per_step: dict[str, float] = field(default_factory=dict)
    products_gflop: float = 0.0  # the matrix products' FLOPs a step (the profiler's count from their shapes), GFLOP

    @property
    def products_ms(self) -> float:
        """The matrix products' own time a step (the model's and the loss's), ms."""
        return sum(self.ms_per_step.get(k, 0.0) for k in PRODUCT_KINDS)


@dataclass
class TrialProfile:
    experiment: str
    overrides: list[str]
    precision: str
    threads: int
    cpu: str
    torch: str
    loadavg_before: list[float]
    loadavg_after: list[float]
    phases: Phases
    step: StepProfile
    matmul_peak_gflops: float = 0.0  # a large square product (2048^3) in the trial's dtype and threads, measured here


# --------------------------------------------------------------------------------------------- start-up
def import_seconds(module: str) -> float:
    """Seconds ``import module`` takes in a fresh interpreter (this one's, the same PYTHONPATH)."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    if out.returncode:
        raise UserError(f"python -c 'import {module}' failed: {out.stderr.strip().splitlines()[-1:]}")
    return float(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------- the phases
def _clock():
    """A Lightning callback timing the phases of a fit (:class:`Phases`' fields), and labelling each training step
    for the profiler."""
    import pytorch_lightning as pl

    class Clock(pl.Callback):
        def __init__(self):
            self.t: dict[str, float] = defaultdict(float)
            self.n = defaultdict(int)
            self.first = self.fit_end = None
            self._mark = self._step = None

        def on_fit_start(self, trainer, pl_module):
            save = trainer.save_checkpoint

            def timed_save(*a, **k):  # ModelCheckpoint and the signal/time callbacks write through this
                t = time.perf_counter()
                try:
                    return save(*a, **k)
                finally:
                    self.t["checkpoints"] += time.perf_counter() - t
            trainer.save_checkpoint = timed_save

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            now = time.perf_counter()
            if self.first is None:
                self.first = now
            elif self._mark is not None:
                self.t["between"] += now - self._mark
            self._step = torch.autograd.profiler.record_function(STEP)
            self._step.__enter__()
            self._mark = now

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._step.__exit__(None, None, None)
            now = time.perf_counter()
            self.t["steps"] += now - self._mark
            self.n["steps"] += 1
            self._mark = now

        def on_validation_start(self, trainer, pl_module):
            now = time.perf_counter()
            if self._mark is not None:
                self.t["between"] += now - self._mark
            self._mark = now

        def on_validation_end(self, trainer, pl_module):
            now = time.perf_counter()
            self.t["validation"] += now - self._mark
            self.n["validation"] += 1
            self._mark = now

        def on_fit_end(self, trainer, pl_module):
            self.fit_end = time.perf_counter()

    return Clock()


def _label_modules(model: torch.nn.Module) -> list:
    """Forward hooks that open a record_function named after each module's class while it runs (the profiled run
    only); their handles, to remove them."""
    handles = []
    for m in model.modules():
        name = type(m).__name__
        if name not in MODULE_KINDS:
            continue
        stack = []

        def pre(mod, args, _stack=stack, _name=LABEL + name):
            rf = torch.autograd.profiler.record_function(_name)
            rf.__enter__()
            _stack.append(rf)

        def post(mod, args, out, _stack=stack):
            _stack.pop().__exit__(None, None, None)
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    return handles


def _labelled(fn, name: str):
    def wrapper(*a, **k):
        with torch.autograd.profiler.record_function(name):
            return fn(*a, **k)
    return wrapper


def _profiling():
    """A Lightning callback that labels the model's modules, the loss and the model's features for the profiler."""
    import pytorch_lightning as pl

    class Labels(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            self.handles = _label_modules(pl_module.model)
            pl_module._features = _labelled(pl_module._features, MODEL)
            pl_module._loss = _labelled(pl_module._loss, LOSS)
            pl_module.training_step = _labelled(pl_module.training_step, TRAINING_STEP)

    return Labels()


# ------------------------------------------------------------------------------------------- the profile
def _kind(event, forward_kind: dict) -> str | None:
    """The row of :data:`STEP_KINDS` an operator's own time goes to, or None when it is outside the steps. The
    innermost of its enclosing regions decides: a backward node (the labels of the forward operator that made it), a
    label of this module's (the model's modules, the loss, the training step), or the optimizer's step and zero_grad
    (Lightning runs the training step and the backward inside ``optimizer.step``'s closure)."""
    labels, decided, e = [], None, event
    while e is not None:
        name = e.name
        if name == STEP:
            break
        if decided is None:
            if name.startswith(LABEL):
                labels.append(name)
            elif name.startswith(BACKWARD):
                found = forward_kind.get(e.sequence_nr)
                if found is None:
                    decided = "autograd: gradient accumulation" if "AccumulateGrad" in name else \
                        "other operators in the step"
                else:
                    labels = labels + found
                    decided = "labels"
            elif name.startswith("Optimizer.step#") and not labels:
                decided = "optimizer step (Adam)"
            elif name.startswith("Optimizer.zero_grad#") and not labels:
                decided = "zero_grad"
        e = e.cpu_parent
    if e is None:  # not inside a training step
        return None
    if decided is not None and decided != "labels":
        return decided
    return _kind_of_labels(event.name, labels)


def _kind_of_labels(op: str, labels: list[str]) -> str:
    """The row of an operator ``op`` run inside the labels ``labels`` (innermost first)."""
    in_loss = LOSS in labels and (MODEL not in labels or labels.index(LOSS) < labels.index(MODEL))
    if in_loss:
        return "loss: vocabulary projection products" if op in MATMUL_OPS else "loss: softmax, smoothing, sums"
    if op in MATMUL_OPS:
        return "matrix products (model)"
    for label in labels:
        kind = MODULE_KINDS.get(label[len(LABEL):])
        if kind and kind != "linear":
            return kind
    return "other operators in the step"


def step_profile(events, steps: int) -> StepProfile:
    """:class:`StepProfile` of a profiled run's events (``prof.events()``)."""
    forward_kind: dict[int, list[str]] = {}
    for e in events:  # forward operators that made an autograd node: the labels they ran inside
        if e.sequence_nr >= 0 and not e.name.startswith(BACKWARD) and e.sequence_nr not in forward_kind:
            labels, p = [], e
            while p is not None:
                if p.name.startswith(LABEL) and p.name != STEP:
                    labels.append(p.name)
                p = p.cpu_parent
            forward_kind[e.sequence_nr] = labels
    us: dict[str, float] = defaultdict(float)
    step_us, flops = 0.0, 0
    for e in events:
        if e.name == STEP:
            step_us += e.cpu_time_total
            continue
        if e.name.startswith(LABEL) or e.name.startswith(BACKWARD) or e.name.startswith("Optimizer."):
            continue  # labels: their time is their operators'
        kind = _kind(e, forward_kind)
        if kind is not None:
            us[kind] += e.self_cpu_time_total
            if kind in PRODUCT_KINDS:
                flops += getattr(e, "flops", 0) or 0
    us["outside operators: Python, autograd engine, Lightning"] = step_us - sum(us.values())
    n = max(steps, 1)
    return StepProfile(steps=steps, step_ms=round(step_us / 1000 / n, 3),
                       ms_per_step={k: round(us.get(k, 0.0) / 1000 / n, 3) for k in STEP_KINDS},
                       products_gflop=round(flops / 1e9 / n, 4))


# ------------------------------------------------------------------------------------------------- a run
def _trial(cfg, profiled: bool):
    """Train ``cfg`` into a fresh temporary results folder: (the clock callback, train()'s start and end, the
    profiler or None)."""
    from ..training.train import train

    clock = _clock()
    callbacks = [clock] + ([_profiling()] if profiled else [])
    with tempfile.TemporaryDirectory(prefix="ltfm-profile-") as tmp:
        cfg = copy.deepcopy(cfg)
        cfg.run.results_dir = tmp
        prof = None
        if profiled:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True)
            prof.__enter__()
        start = time.perf_counter()
        try:
            summary = train(cfg, callbacks=callbacks)
        finally:
            end = time.perf_counter()
            if prof is not None:
                prof.__exit__(None, None, None)
    return clock, start, end, prof, summary


def profile_trial(experiment: str, overrides: list[str], log=print) -> TrialProfile:
    """The two runs of the module's docstring, of ``experiment`` with ``overrides``."""
    from ..training.config.config import load_config
    from .speed import cpu_name, matmul_peak_flops

    if not any(o.startswith("train.max_steps=") for o in overrides):
        overrides = [*overrides, f"train.max_steps={DEFAULT_STEPS}"]
    overrides = [*overrides, "train.progress_bar=false"]
    cfg = load_config(experiment, overrides)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    load_before = [round(x, 2) for x in os.getloadavg()]
    log("ltfm bench --profile: start-up (imports in fresh interpreters)")
    imp_ltfm, imp_pl = import_seconds("lightning_tfm.training.train"), import_seconds("lightning_tfm.training.lit")
    log(f"ltfm bench --profile: the trial without a profiler ({cfg.train.max_steps} steps)")
    clock, start, end, _, summary = _trial(cfg, profiled=False)
    t = clock.t
    phases = Phases(steps=clock.n["steps"], import_ltfm_s=round(imp_ltfm, 2), import_lightning_s=round(imp_pl, 2),
                    setup_s=round(clock.first - start, 2), train_steps_s=round(t["steps"], 2),
                    between_steps_s=round(t["between"] - t["checkpoints"], 2), checkpoints_s=round(t["checkpoints"], 2),
                    validation_s=round(t["validation"], 2), validations=clock.n["validation"],
                    closing_s=round(end - clock.fit_end, 2), total_s=round(end - start, 2))
    log("ltfm bench --profile: the trial under torch.profiler")
    clock, _, _, prof, _ = _trial(cfg, profiled=True)
    step = step_profile(prof.events(), clock.n["steps"])
    precision = str(summary.get("precision"))
    log("ltfm bench --profile: a large matrix product's rate (the peak MFU is measured against)")
    peak = matmul_peak_flops(torch.bfloat16 if precision.startswith("bf16") else torch.float32)
    return TrialProfile(experiment=experiment, overrides=overrides, precision=precision,
                        threads=torch.get_num_threads(), cpu=cpu_name(), torch=torch.__version__,
                        loadavg_before=load_before, loadavg_after=[round(x, 2) for x in os.getloadavg()],
                        phases=phases, step=step, matmul_peak_gflops=round(peak / 1e9, 2))


# ------------------------------------------------------------------------------------------------ output
def format_profile(p: TrialProfile) -> str:
    """Two markdown tables: the phases (seconds, share of the trial with its start-up), the step by kind of work."""
    ph = p.phases
    whole = ph.import_lightning_s + ph.total_s
    rows = [("start-up: a trial's imports, `import lightning_tfm.training.lit` in a fresh process (of which "
             f"`import lightning_tfm.training.train`, torch and the config: {ph.import_ltfm_s:.2f} s)",
             ph.import_lightning_s),
            ("set-up in the process (corpus read, model, Trainer) to the first step", ph.setup_s),
            (f"training steps ({ph.steps}: {ph.step_ms:.1f} ms a step)", ph.train_steps_s),
            ("between steps: the next batch's collation, Lightning's loop", ph.between_steps_s),
            ("checkpoint writes", ph.checkpoints_s),
            (f"validation ({ph.validations}: whole dev set, loss and PPL)", ph.validation_s),
            ("closing evaluation (BLEU decode of the dev set) and summary", ph.closing_s)]
    rest = ph.total_s - sum(s for _, s in rows[1:])
    rows.append(("the rest of train() (run folder, loggers, W&B)", round(rest, 2)))
    lines = [f"{p.experiment} {' '.join(p.overrides)}: {p.cpu}, torch {p.torch}, {p.threads} thread(s), "
             f"precision {p.precision}, load average {p.loadavg_before[0]:.2f} before, {p.loadavg_after[0]:.2f} "
             "after", "", "| phase | s | share |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {s:.2f} | {s / whole:.1%} |" for name, s in rows]
    lines += [f"| **in all** | **{whole:.2f}** | |", ""]
    st = p.step
    total = sum(st.ms_per_step.values())
    lines += [f"The training step under torch.profiler ({st.steps} steps, {st.step_ms:.1f} ms a profiled step):", "",
              "| kind of work (forward + backward) | ms a step | share |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {v:.2f} | {v / max(total, 1e-9):.1%} |" for k, v in st.ms_per_step.items()]
    if p.matmul_peak_gflops > 0 and st.products_gflop > 0 and st.products_ms > 0:
        peak, rate = p.matmul_peak_gflops, st.products_gflop / st.products_ms * 1000
        lines += ["", f"The step's matrix products: {st.products_gflop:.2f} GFLOP a step (the profiler's count from "
                  f"their shapes) in {st.products_ms:.1f} ms of their own, {rate:.1f} GFLOP/s: {rate / peak:.0%} of "
                  f"a large product's {peak:.1f} GFLOP/s here (2048 x 2048 x 2048, the peak MFU is measured "
                  "against), the MFU a step would reach were everything but its products free. The step without "
                  f"the profiler ({ph.step_ms:.1f} ms): MFU {st.products_gflop / ph.step_ms * 1000 / peak:.0%}."]
    return "\n".join(lines)


def bench_profile_cli(args) -> int:
    """``ltfm bench --config EXPERIMENT.yaml --profile [dotted.key=value ...]``."""
    experiment, overrides = args.config, list(args.overrides)
    if experiment is None and overrides and overrides[0].endswith((".yaml", ".yml")):
        experiment = overrides.pop(0)
    if experiment is None:
        raise UserError("--profile profiles a trial of an experiment: give it, e.g. ltfm bench --config "
                        "experiments/table3-cpu-base.yaml --profile")
    bench = [o for o in overrides if o.startswith("bench.")]
    if bench:
        raise UserError(f"{bench[0]}: --profile runs the experiment's own trial, its shapes are config keys "
                        "(e.g. model.d_model=256): drop it")
    p = profile_trial(experiment, overrides, log=(lambda *a: None) if args.json else
                      (lambda m: print(m, file=sys.stderr, flush=True)))
    print(json.dumps(asdict(p), indent=2) if args.json else format_profile(p))
    return 0
