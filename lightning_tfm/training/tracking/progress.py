"""Progress of a training without a progress bar: one line on stderr at each validation and every ``every`` seconds
in between (step, share of the budget, training loss, dev perplexity, time so far and time left), then one when
fitting ends and the closing evaluation starts. ``ltfm train`` uses it where Lightning's bar would not show: stderr
is not a terminal (a log file, a pipe, CI) or ``train.progress_bar=false`` (:func:`wants_lines`). And what a run
does not say (:func:`quiet_lightning`): Lightning's advertisements and a deprecation inside Lightning itself, which
would otherwise open every trial's log.
"""
from __future__ import annotations

import logging
import sys
import time
import warnings

import pytorch_lightning as pl

from ..config.config import Config
from ..runs import results

#: Seconds between two progress lines when no validation came between (the sweep's --every default too).
EVERY_S = 30.0


_LIGHTNING_PYTREE = r"(pytorch_lightning|lightning\.pytorch)\.utilities\._pytree"


class _NoTips(logging.Filter):
    """Drops Lightning's "💡 Tip: ... try installing [litlogger]" and "[litmodels]" records."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def quiet_lightning() -> None:
    """Before a Trainer is built: Lightning 2.6 logs a tip for its cloud services (litlogger, litmodels) at every
    fit, with no setting to turn it off (its logger connector does so unless a LitLogger is among the loggers), so
    its records are filtered out where they are made (the ``rank_zero`` loggers); and torch 2.13 deprecates the
    ``LeafSpec()`` that Lightning's own ``utilities/_pytree.py`` builds for every DataLoader (a FutureWarning our
    code does not cause, and can neither avoid nor fix), ignored for that module only. Idempotent."""
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _NoTips) for f in log.filters):
            log.addFilter(_NoTips())
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning, module=_LIGHTNING_PYTREE)


def wants_lines(cfg: Config, terminal: bool) -> bool:
    """Whether a run shows progress lines instead of Lightning's bar: no bar asked, or no terminal to draw it on."""
    return not (cfg.train.progress_bar and terminal)


def _hms(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class ProgressLines(pl.Callback):
    """The lines themselves (global rank zero alone writes them)."""

    def __init__(self, run_id: str, every: float = EVERY_S, out=None):
        super().__init__()
        self.run_id, self.every, self.out = run_id, every, out
        self.t0 = self.last = 0.0
        self.step0 = 0

    def say(self, trainer, msg: str) -> None:
        if trainer.is_global_zero:
            print(f"ltfm: {msg}", file=self.out or sys.stderr, flush=True)

    def on_train_start(self, trainer, pl_module) -> None:
        self.t0 = self.last = time.monotonic()
        self.step0 = trainer.global_step
        self.say(trainer, f"training {self.run_id} from step {self.step0} to {trainer.max_steps}: a line at each "
                          f"validation and every {self.every:g} s")

    def line(self, trainer) -> None:
        self.last = now = time.monotonic()
        step, total = trainer.global_step, trainer.max_steps
        m = trainer.callback_metrics
        parts = [f"step {step}/{total} ({100 * step / max(total, 1):.0f}%)"]
        if results.TRAIN_LOSS in m:
            parts.append(f"loss {float(m[results.TRAIN_LOSS]):.3f}")
        if results.DEV_PPL in m:
            parts.append(f"dev ppl {float(m[results.DEV_PPL]):.1f}")
        done = step - self.step0
        left = f", about {_hms((now - self.t0) / done * (total - step))} left" if done > 0 else ""
        self.say(trainer, f"{', '.join(parts)}; {_hms(now - self.t0)} so far{left}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if time.monotonic() - self.last >= self.every:
            self.line(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.line(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self.say(trainer, f"training stopped at step {trainer.global_step} after {_hms(time.monotonic() - self.t0)}; "
                          "the closing evaluation (BLEU) follows")
