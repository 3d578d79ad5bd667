"""The settings of the findings: the sweep file's ``report:`` section (:class:`ReportSpec`, the verdict's
settings) and its ``settle:`` section (:class:`SettleSpec`, the answers' and the settle loop's), with the ranges
their fields take. The sweep file's schema (:mod:`lightning_tfm.sweep.schema`) reads
them as its sections.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ..base.knobs import Range, knob

# The curve families the verdict can fit (:data:`.curves.FAMILIES`: their parameters)
CURVE_FAMILIES = ("power", "saturating", "exponential")
# The most bootstrap draws of a family's fit: power refits all draws at once (linear least squares), the others
# refit each draw by nonlinear least squares (about 1 to 2 ms a draw, of every run, at every report or figure):
# their default 200 takes a minute, 100000 took 15 hours. (checked with the family: :func:`draws_problem`)
MAX_DRAWS = {"power": 20000, "saturating": 2000, "exponential": 2000}
# The ranges of the numbers the settings take
SEED = Range(0, 2 ** 32 - 1, text="an integer from 0 to 2**32 - 1")  # as Lightning's seeding takes it
SHARE = Range(0, 1, lo_open=True, hi_open=True, text="a number in (0, 1)")  # a central share of bootstrap draws
DRAWS = Range(20, max(MAX_DRAWS.values()), text="an integer from 20 to 20000")  # and at most MAX_DRAWS[family]


@dataclass
class ReportSpec:
    """The settings of the report's verdict (the rule: :mod:`.verdict`; the fit: :mod:`.curves`)."""
    k: float = knob(3.0, "the budget multiple the verdict predicts at: a row holds when its predicted gap to the "
                         "base at k x the budget keeps today's sign",
                    Range(1, 1000, text="a number >= 1 (budgets; at most 1000)"))
    min_points: int = knob(3, "validations after the warmup a run's curve fit needs at least (and one more than the "
                              "family's parameters)",
                           Range(3, 100000, text="an integer >= 3 (validations; at most 100000)"))
    level: float = knob(0.8, "the central share of the predicted gap's interval (its size at k x; 80%: the level "
                             "the back-tests support, findings.curves.EXTRAPOLATION_LEVEL)", SHARE)
    bootstraps: int = knob(200, "bootstrap draws of the predicted gap (residual bootstrap of each run's fit, the "
                                "base's seeds resampled; at most 20000 for power, 2000 for the other families)",
                           DRAWS)
    seed: int = knob(0, "seed of the bootstrap: the same seed, the same intervals", SEED)
    family: Literal[CURVE_FAMILIES] = knob("power", "the curve fitted to each run's dev log-PPL: power (A "
                                                    "t^-alpha, the back-tested best at short budgets), saturating "
                                                    "(L_inf + A t^-alpha) or exponential (L_inf + A exp(-t/tau)); "
                                                    "these two need 4 points and refit by least squares at every "
                                                    "draw (slower)")


REPORT_DEFAULTS = dataclasses.asdict(ReportSpec())  # the report's verdict settings when a file sets none


# The ranges of the settle loop's settings
DELTA = Range(0, 1, lo_open=True, hi_open=True, text="a number in (0, 1) (a relative change of dev PPL: 0.05 = ±5%)")
ALPHA = Range(0, 0.5, lo_open=True, text="a number in (0, 0.5] (a probability)")
ROW_SEEDS = Range(2, 100, text="an integer from 2 to 100 (seeds)")
BUDGET = Range(1, 1000, text="a number >= 1 (budgets; at most 1000)")
HOURS = Range(0, 10000, lo_open=True, text="a positive number of hours (at most 10000), or null for no limit")


@dataclass
class SettleSpec:
    """The settings of the answers (:mod:`.answers`) and of the settle loop that gathers them (:mod:`.settle`): the
    sweep file's ``settle:`` section.

    The defaults are what the replay on the committed en->de exports measured (``ltfm report
    sweeps/table3-cpu.yaml --settle-replay ... --settle-grid``: ``reports/reference/settle-replay.md``, a grid of
    48 settings): with alpha 0.1, 3 seeds a row and no budget extension, all 8 rows whose seeds the exports hold
    are answered, at 1.77x the first pass's compute; alpha 0.05 answers 4 (1.56x); a budget cap of 3x answers 5 at
    3.20x (its looks at 3x halve each look's alpha, and the rows it would settle are settled by seeds); a cap of 2
    seeds answers 4 at 1.28x (a look at 2 seeds is a t of 1 degree of freedom); delta from 0.02 to 0.2 changes no
    answer at 1x there (the exports hold three seeds only of rows that differ), and 0.05 is the median of the
    paper's Table 3 effects: the default where seeds resolve it. ``sweeps/table3-cpu.yaml`` sets 0.2, what its
    600 CPU steps resolve (its comment gives the measurement). Alpha 0.1 a
    row is a 90% interval (Table 2's level) and at most 2 false answers expected in a table of 20 rows."""
    delta: float = knob(0.05, "'the same within ±delta': a row is the same as the base when the interval of its "
                              "mean dev log-PPL difference lies inside ±log(1 + delta) (0.05: ±5% of dev PPL, the "
                              "median of the paper's Table 3 effects)", DELTA)
    alpha: float = knob(0.1, "each row's false-answer rate, all the looks of the settle loop together (Bonferroni "
                              "over the looks the caps allow: findings.answers); a table of R rows expects at most "
                              "R x alpha false answers", ALPHA)
    seeds: int = knob(3, "the most seeds a row (the first pass's seeds count)", ROW_SEEDS)
    base_seeds: int = knob(10, "the most seeds of the base: each row seed is paired with the base's same seed, so "
                               "the loop trains the base the seeds its rows reach, and a row's looks stop at this",
                           Range(2, 1000, text="an integer from 2 to 1000 (seeds)"))
    budget: float = knob(1.0, "the most budget multiple a row and the base may be continued to (1: no extension; "
                              "over 1, a row is judged at 1 x and at this multiple, which doubles its looks)", BUDGET)
    hours: float | None = knob(None, "the most wall hours the settle passes may take (null: no limit)", HOURS)


SETTLE_DEFAULTS = dataclasses.asdict(SettleSpec())  # the settle loop's settings when a file sets none
