"""Each row's answer (lightning_tfm/findings/answers.py) and the settle planner (findings/settle.py) on a known truth:
rows with no difference (the committed base seeds under another name, and normal draws) are called better or worse
in at most the stated rate, over every look the caps allow; rows with a known gap (none, small, large, crossing)
get the answer the gap implies. Statistical tests with fixed seeds: deterministic, no timing."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lightning_tfm.findings.answers import (
    BETTER,
    SAME,
    UNSETTLED,
    WORSE,
    answer_row,
    look_level,
    looks,
    one_seed_false_rate,
    paired,
    welch,
)
from lightning_tfm.findings.settings import SETTLE_DEFAULTS, SettleSpec
from lightning_tfm.findings.settle import RowRuns, decide_chance, plan, seeds_needed

from conftest import ROOT

BASE_EXPORTS = ("table3-cpu-heldout", "table3-cpu-heldout-s3", "table3-cpu-heldout-s4")  # base seeds 1-3, 4-6, 7-9


def committed_base() -> dict[int, dict[int, float]]:
    """The committed en->de base seeds 1-9: seed -> {step: dev log-PPL} at 600 and 1,800 steps."""
    out = {}
    for name in BASE_EXPORTS:
        tree = json.loads((ROOT / "reports" / "reference" / name / "export" / f"{name}.json").read_text())
        for r in tree["records"]:
            if r["variant"] == "base":
                out[r["seed"]] = {h["step"]: h["dev/loss"] for h in r["history"] if h["step"] in (599, 1799)}
    assert sorted(out) == list(range(1, 10))
    return out


def settle(data: dict[str, list[dict[float, float]]], spec: SettleSpec, first: dict[str, int]):
    """The settle loop on known values: ``data[variant][seed - 1]`` = {budget multiple: dev log-PPL}; each trial the
    planner asks for is answered from it. Returns the last plan and the trials run."""
    known = {v: RowRuns(v, {}, cost=1.0) for v in data}

    def run(v, seed, level):
        for lv, x in data[v][seed - 1].items():
            if lv <= level:
                known[v].values.setdefault(lv, {})[seed] = x

    for v, n in first.items():
        for s in range(1, n + 1):
            run(v, s, 1.0)
    trials = []
    for _ in range(50):
        p = plan(known, "base", spec)
        if p.done:
            return p, trials
        for a in p.actions:
            run(a.variant, a.seed, a.budget)
            trials.append(a)
    raise AssertionError("the loop did not end in 50 passes")


def tolerance(rate: float, n: int) -> float:
    """Three binomial standard errors of a rate measured over n draws."""
    return 3 * math.sqrt(rate * (1 - rate) / n)


def test_defaults_and_looks():
    spec = SettleSpec()
    assert SETTLE_DEFAULTS == {"delta": 0.05, "alpha": 0.1, "seeds": 3, "base_seeds": 10, "budget": 1.0,
                               "hours": None}
    assert looks(spec) == [(3, 1.0)] and look_level(spec) == pytest.approx(0.9)
    wide = SettleSpec(seeds=5, budget=3.0)
    assert looks(wide) == [(3, 1.0), (4, 1.0), (5, 1.0), (3, 3.0), (4, 3.0), (5, 3.0)]
    assert look_level(wide) == pytest.approx(1 - 0.1 / 6)
    assert looks(SettleSpec(seeds=5, base_seeds=4)) == [(3, 1.0), (4, 1.0)]  # each row seed needs its base pair


def test_the_one_seed_rule_errs_22_percent_on_no_difference():
    """Today's 2 x base-sd rule on a row of one seed against 3 base seeds: t with 2 df, 22.5%, and normal draws
    agree; such a row is unsettled (one seed) and its verdict is said beside."""
    assert one_seed_false_rate(3) == pytest.approx(0.2254, abs=1e-4)
    rng = np.random.default_rng(0)
    x, base = rng.normal(size=200_000), rng.normal(size=(200_000, 3))
    called = np.abs(x - base.mean(axis=1)) > 2 * base.std(axis=1, ddof=1)
    assert called.mean() == pytest.approx(one_seed_false_rate(3), abs=0.005)
    a = answer_row({1: 3.5}, {1: 3.0, 2: 3.05, 3: 2.97}, SettleSpec())
    assert a.answer == UNSETTLED and a.method == "one seed"
    assert "unsettled (one seed)" in a.why and "beyond" in a.why and "23%" in a.why


def test_null_rows_from_the_committed_base_seeds():
    """A "row" made of committed base seeds under another name against other base seeds (true difference 0): the
    whole settle loop calls it better or worse in at most alpha of the resampled tables, at 600 and 1,800 steps."""
    base = committed_base()
    rng = np.random.default_rng(61)
    for spec in (SettleSpec(), SettleSpec(alpha=0.2, budget=3.0)):
        wrong = n = 0
        for _ in range(300):
            pick = rng.permutation(9)[:6] + 1
            row_seeds, base_seeds = pick[:3], pick[3:]
            data = {"row": [{1.0: base[s][599], 3.0: base[s][1799]} for s in row_seeds],
                    "base": [{1.0: base[s][599], 3.0: base[s][1799]} for s in base_seeds]}
            p, _ = settle(data, spec, {"row": 1, "base": 3})
            wrong += p.answers["row"].answer in (BETTER, WORSE)
            n += 1
        assert wrong / n <= spec.alpha + tolerance(spec.alpha, n), (spec, wrong, n)


@pytest.mark.parametrize("ratio,corr", [(1.0, 0.0), (3.0, 0.0), (0.3, 0.8), (3.0, 0.8)])
def test_every_look_together_holds_alpha_on_normal_data(ratio, corr):
    """With no difference, the chance that ANY of the looks the caps allow (3 to 5 seeds, 1x and 3x: six) calls the
    row better or worse is at most alpha, whatever the two sides' variances and their correlation: the union
    bound over every designated look, so whatever path the planner takes. Welch-Satterthwaite's unpaired interval
    at the same level does not hold it with 3 row seeds of 3x the base's sd."""
    spec = SettleSpec(alpha=0.1, seeds=5, budget=3.0)
    rng = np.random.default_rng(7)
    n, any_paired, welch_3 = 3000, 0, 0
    cov = np.array([[ratio ** 2, corr * ratio], [corr * ratio, 1.0]]) * 0.05 ** 2
    all_draws = {lv: rng.multivariate_normal([3.0, 3.0], cov, size=(n, spec.seeds)) for lv in (1.0, 3.0)}
    for i in range(n):
        draws = {lv: d[i] for lv, d in all_draws.items()}
        called = False
        for k, lv in looks(spec):
            row = {s + 1: draws[lv][s, 0] for s in range(k)}
            base = {s + 1: draws[lv][s, 1] for s in range(k)}
            called |= answer_row(row, base, spec, lv).answer in (BETTER, WORSE)
        any_paired += called
        lo, hi = welch(list(draws[1.0][:3, 0]), list(rng.normal(3.0, 0.05, 6)), look_level(spec), df="welch")[1:3]
        welch_3 += lo > 0 or hi < 0
    assert any_paired / n <= spec.alpha + tolerance(spec.alpha, n)
    if ratio == 3.0 and corr == 0.0:
        per_look = spec.alpha / len(looks(spec))
        assert welch_3 / n > per_look + tolerance(per_look, n)  # why the answers do not use it


def test_a_false_same_is_as_rare_as_a_false_better():
    """A row whose true difference lies beyond ±delta (1.3 x log(1 + delta)) is called the same in at most alpha
    of the tables, over every look."""
    spec = SettleSpec(alpha=0.1, seeds=5, delta=0.05)
    rng = np.random.default_rng(11)
    gap, n, called = 1.3 * math.log1p(spec.delta), 3000, 0
    for _ in range(n):
        d = rng.normal(gap, 0.02, spec.seeds)
        hit = False
        for k, lv in looks(spec):
            hit |= answer_row({s + 1: 3.0 + d[s] for s in range(k)}, {s + 1: 3.0 for s in range(k)}, spec,
                              lv).answer == SAME
        called += hit
    assert called / n <= spec.alpha + tolerance(spec.alpha, n)


@pytest.mark.parametrize("gap,sd,expected,share", [
    (0.30, 0.05, WORSE, 0.99),      # large: worse, nearly always
    (-0.30, 0.05, BETTER, 0.99),    # large the other way
    (0.0, 0.005, SAME, 0.85),       # none, with little seed noise: the same within ±5% (else a false better/worse)
    (0.015, 0.005, WORSE, 0.85),    # small, well inside delta: the same, or worse when the seeds see it (both true)
])
def test_known_gaps_get_their_answer(gap, sd, expected, share):
    """Synthetic rows with a known gap through the whole loop (first pass: one row seed, three base seeds; the row
    the scout that measures a seed difference)."""
    spec = SettleSpec()
    rng = np.random.default_rng(3)
    got = []
    for _ in range(200):
        base = rng.normal(3.0, 0.05, 10)
        row = base + gap + rng.normal(0, sd, 10)
        data = {"row": [{1.0: x} for x in row], "base": [{1.0: x} for x in base]}
        p, _ = settle(data, spec, {"row": 1, "base": 3})
        got.append(p.answers["row"].answer)
    true = {expected, SAME} if abs(gap) < math.log1p(spec.delta) else {expected}
    assert sum(got.count(a) for a in true) / len(got) >= share, {a: got.count(a) for a in set(got)}
    if gap:
        assert {BETTER: WORSE, WORSE: BETTER}[expected] not in got  # never the other direction
    else:  # a false better or worse as rare as alpha
        assert (got.count(BETTER) + got.count(WORSE)) / len(got) <= spec.alpha + tolerance(spec.alpha, len(got))


def test_a_crossing_the_curves_predict_is_settled_by_a_longer_budget():
    """The row crosses the base at the budget (no difference at 600 steps) and its fitted curve is well below the
    base's by 3x: the planner continues the row's and the base's runs to 3x rather than adding seeds that could
    not answer at 1x."""
    steps = list(range(49, 600, 50))
    rng = np.random.default_rng(5)

    def curve(a, alpha, noise):
        return {s: a * (s + 1) ** -alpha + noise for s in steps}

    base = RowRuns("base", {}, {}, cost=1.0, budget_step=599)
    row = RowRuns("row", {}, {}, cost=1.0, budget_step=599)
    for seed in (1, 2, 3):
        b = curve(12.0, 0.2, rng.normal(0, 0.01))
        # the row starts worse and learns faster: equal at step 599, well below by step 1799
        r = {s: b[s] * ((s + 1) / 600) ** -0.15 + rng.normal(0, 0.01) for s in steps}
        base.curves[seed], row.curves[seed] = b, r
        base.values.setdefault(1.0, {})[seed] = b[599]
        row.values.setdefault(1.0, {})[seed] = r[599]
    spec = SettleSpec(seeds=5, budget=3.0, delta=0.01)
    p = plan({"base": base, "row": row}, "base", spec)
    assert p.answers["row"].answer == UNSETTLED
    assert {(a.variant, a.seed, a.budget) for a in p.actions} == {(v, s, 3.0) for v in ("row", "base")
                                                                   for s in (1, 2, 3)}
    assert "budget 3x" in p.waiting["row"]


def test_the_plan_asks_the_next_seeds_and_the_same_each_time():
    """A row of one seed with a plug-in answer at 3 seeds gets seeds 2 and 3 (the base has them: no base trial); a
    row at seeds 1 and 4 gets 2 and, for the pair, the base's seed 4 is trained; the same inputs give the same plan."""
    base = RowRuns("base", {1.0: {1: 3.00, 2: 3.05, 3: 2.95}})
    rows = {"base": base, "A": RowRuns("A", {1.0: {1: 3.6}}), "B": RowRuns("B", {1.0: {1: 3.3, 4: 3.35}})}
    p = plan(rows, "base", SettleSpec())
    assert [(a.variant, a.seed, a.budget) for a in p.actions] == [("base", 4, 1.0), ("A", 2, 1.0), ("A", 3, 1.0),
                                                                   ("B", 2, 1.0)]
    assert p == plan(rows, "base", SettleSpec()) and not p.done
    assert "the base's seed(s) 4" in p.waiting["B"]


def test_answered_rows_rest_and_the_caps_stop_the_loop():
    base = RowRuns("base", {1.0: {1: 3.00, 2: 3.05, 3: 2.95}})
    answered = RowRuns("A", {1.0: {1: 3.60, 2: 3.75, 3: 3.50}})  # its seed differences' sd: 0.076
    close = RowRuns("C", {1.0: {1: 3.02}})  # +2%: at A's sd, no look within 3 seeds answers it
    p = plan({"base": base, "A": answered, "C": close}, "base", SettleSpec())
    assert p.answers["A"].answer == WORSE and "A" not in p.waiting and p.done and not p.actions
    assert p.waiting["C"].startswith("at its cap")
    assert seeds_needed(close, base, SettleSpec()) is None or seeds_needed(close, base, SettleSpec()) > 3
    out = plan({"base": base, "A": RowRuns("A", {1.0: {1: 3.6}})}, "base", SettleSpec(hours=1.0), hours_spent=1.0)
    assert out.done and not out.actions and out.waiting["A"] == "at its cap: 1 hours spent"


@pytest.mark.parametrize("d,sd,delta", [(0.0, 0.06, 0.2), (0.09, 0.06, 0.2), (0.2, 0.06, 0.2), (0.0, 0.06, 0.05),
                                         (0.04, 0.02, 0.05), (-0.12, 0.1, 0.2)])
def test_the_chance_a_look_decides_is_what_draws_of_it_show(d, sd, delta):
    """decide_chance against 100,000 normal draws of a 3-seed look at 90%: the share whose interval decides
    (excludes zero or lies inside ±log(1 + delta)), within 3 of its binomial standard errors plus the quadrature's
    0.002."""
    rng = np.random.default_rng(11)
    x = rng.normal(d, sd, (100_000, 3))
    m, s = x.mean(1), x.std(1, ddof=1)
    h = 2.919986 * s / math.sqrt(3)
    bound = math.log1p(delta)
    drawn = float(((m - h > 0) | (m + h < 0) | ((m - h > -bound) & (m + h < bound))).mean())
    assert abs(decide_chance(d, sd, 3, 0.9, delta) - drawn) <= 3 * math.sqrt(drawn * (1 - drawn) / len(x)) + 0.002


def test_a_row_between_the_answers_gets_its_first_look():
    """At ±20% and a seed-difference sd of 0.06 nats (the committed study's median), 3 seeds decide 73% of the time
    or more at every true difference, although today's interval at a difference near log(1.2) / 2 decides neither
    way: the planner brings such a row of one seed to its first look rather than leave it at its cap."""
    spec = SettleSpec(delta=0.2)
    chances = [decide_chance(d / 1000, 0.06, 3, look_level(spec), spec.delta) for d in range(0, 400, 5)]
    assert min(chances) >= 0.73
    base = RowRuns("base", {1.0: {1: 3.00, 2: 3.05, 3: 2.95}})
    answered = RowRuns("A", {1.0: {1: 3.60, 2: 3.71, 3: 3.49}})  # its seed differences' sd: 0.06
    between = RowRuns("C", {1.0: {1: 3.09}})  # +9%: today's 3-seed interval would be +-0.10 around it
    h = 2.919986 * 0.06 / math.sqrt(3)
    assert 0.09 < h and 0.09 + h > math.log1p(spec.delta)  # neither answer from today's interval
    p = plan({"base": base, "A": answered, "C": between}, "base", spec)
    assert [(a.variant, a.seed) for a in p.actions] == [("C", 2), ("C", 3)]
    assert p.answers["A"].answer == WORSE and p.waiting["C"] == "2 more seed(s) to 3"


def test_paired_is_the_t_interval_of_the_differences():
    row, base = {1: 3.1, 2: 3.3, 3: 3.2}, {1: 3.0, 2: 3.1, 3: 3.05, 4: 9.9}
    m, lo, hi = paired(row, base, 0.9)
    d = np.array([0.1, 0.2, 0.15])
    half = 2.919986 * d.std(ddof=1) / math.sqrt(3)  # t(0.95, 2)
    assert (m, lo, hi) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))
