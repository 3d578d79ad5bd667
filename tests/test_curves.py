"""Learning curves fitted and extrapolated (lightning_tfm.findings.curves) and the verdict that reads them
(lightning_tfm.report.table3.verdict), on synthetic curves with known asymptotes: no training, no data."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_tfm.findings import backtest, curves
from lightning_tfm.report.table3 import verdict

STEPS = range(99, 600, 100)   # a validation every 100 updates, Lightning's steps: the budget is 600 updates
LATER = 1799                  # 3 x the budget: the verdict's default k


def saturating(l_inf: float, a: float, alpha: float):
    """Dev log-PPL after t updates: L_inf + A t^-alpha."""
    return lambda t: l_inf + a * t ** -alpha


def run(f, noise: float = 0.0, seed: int = 0, steps=STEPS) -> dict[int, float]:
    """One run's {step: dev PPL} of the log-PPL law ``f``, with Gaussian noise on the log-PPL."""
    rng = np.random.default_rng(seed)
    return {s: math.exp(f(s + 1) + noise * rng.standard_normal()) for s in steps}


BASE = saturating(1.5, 30.0, 0.5)


def test_a_fit_recovers_the_law_it_was_drawn_from():
    t = np.arange(99, 3000, 100) + 1.0
    fit = curves.fit_curve(t - 1, 2.0 + 30.0 * t ** -0.6, family="saturating", min_points=4)
    named = fit.named()
    assert named["L_inf"] == pytest.approx(2.0, abs=1e-4) and named["alpha"] == pytest.approx(0.6, abs=1e-4)
    assert named["A"] == pytest.approx(30.0, rel=1e-3)
    assert fit.predict(9999) == pytest.approx(2.0 + 30.0 * 10000 ** -0.6, abs=1e-4)
    # the power law (the verdict's default) recovers its own: A t^-alpha, a line in log-log
    power = curves.fit_curve(t - 1, 7.0 * t ** -0.3)
    assert power.named() == pytest.approx({"A": 7.0, "alpha": 0.3})
    assert power.predict(np.array([LATER]))[0] == pytest.approx(7.0 * 1800 ** -0.3)
    # the exponential saturation, too
    expo = curves.fit_curve(t - 1, 2.5 + 3.0 * np.exp(-t / 800.0), family="exponential", min_points=4)
    assert expo.named() == pytest.approx({"L_inf": 2.5, "A": 3.0, "tau": 800.0}, rel=1e-3)


def test_the_fit_reads_the_points_after_the_warmup_or_drops_the_first_when_few():
    steps = list(STEPS)  # 99 .. 599
    assert curves.fit_points(steps, warmup=200, need=3) == [299, 399, 499, 599]
    assert curves.fit_points(steps[:4], warmup=200, need=3) == [199, 299, 399]   # 2 after the warmup: all but one
    assert curves.fit_points(steps[:3], warmup=200, need=3) == []                # too few either way
    fit = curves.fit_run(run(BASE), warmup=200)
    assert fit.steps == (299, 399, 499, 599) and fit.left_out == (99, 199)


def test_too_few_points_give_no_fit_and_say_so():
    short = run(BASE, steps=range(99, 300, 100))  # 3 validations, 1 after a warmup of 200
    assert curves.fit_run(short, warmup=200) is None
    assert curves.fit_curve([99, 199], [5.0, 4.0]) is None
    # three parameters need a fourth point, whatever min_points says
    assert curves.points_needed(3, "saturating") == 4 and curves.fit_run(short, family="saturating") is None
    assert curves.predicted_gap([short], [run(BASE)], LATER, warmup=200) is None
    v = verdict.curve_verdict([short], [run(BASE)], delta=-3.0, noise="beyond", warmup=200)
    assert v.verdict == verdict.TOO_FEW and v.gap is None
    assert v.why == "the row: 1 validation(s) after the warmup (step 200), the fit needs 3"
    # one base seed: the noise is unknown, whatever the curves say
    assert verdict.curve_verdict([run(BASE)], [run(BASE)], 1.0, "unknown").verdict == verdict.TOO_FEW


def test_two_parallel_curves_hold():
    # 0.5 nats worse at every step, to the asymptote: beyond the extrapolation's error at 3x (0.38 nats)
    row = saturating(2.0, 30.0, 0.5)
    v = verdict.curve_verdict([run(row)], [run(BASE)], delta=1.0, noise="beyond")
    gap = v.gap
    assert v.verdict == verdict.HOLDS and gap.low > 0 and gap.at_step == LATER
    assert gap.low < 0.5 < gap.high and gap.point == pytest.approx(0.5, abs=0.05)  # the true gap inside
    assert v.settle is None  # a row that holds has settled
    # 0.2 nats, as steady: the direction holds (its one-sided bound, the point less SIGN_QUANTILE x today's gap,
    # stays above zero), whatever the size's interval
    near = verdict.curve_verdict([run(saturating(1.7, 30.0, 0.5))], [run(BASE)], delta=1.0, noise="beyond")
    g = near.gap
    assert near.verdict == verdict.HOLDS and g.now == pytest.approx(0.2, abs=0.02)
    assert g.sign_margin == pytest.approx(curves.SIGN_QUANTILE * abs(g.now))   # one base seed: no noise term
    assert 0 < g.point - g.sign_margin < g.point and "; direction bound +" in near.why
    assert v.why == verdict.gap_text(gap) and "at 1800 steps; direction bound +" in v.why
    assert v.why.startswith(f"{100 * math.expm1(gap.point):+.1f}% [")
    # the same pair the other way round (the row better): holds on its own side
    assert verdict.curve_verdict([run(BASE)], [run(row)], -1.0, "beyond").verdict == verdict.HOLDS


def test_a_crossing_late_in_the_budget_may_flip():
    # the row starts faster and saturates higher: better at the budget (step 599) by 6%, worse from step ~750
    row = saturating(2.3, 60.0, 0.8)
    assert row(600) < BASE(600) and row(900) > BASE(900) and row(1800) - BASE(1800) == pytest.approx(0.24, abs=0.01)
    v = verdict.curve_verdict([run(row)], [run(BASE)], delta=-0.98, noise="beyond")
    assert v.verdict == verdict.MAY_FLIP and v.gap.high > 0   # not holds: the interval leaves today's side
    # noise at the end decides first
    assert verdict.curve_verdict([run(row)], [run(BASE)], -0.98, "within").verdict == verdict.WITHIN
    assert verdict.curve_verdict([run(row)], [run(BASE)], None, None) is None  # the base, or no completed run


def test_noise_widens_the_interval_and_the_base_seeds_are_resampled():
    row = saturating(1.7, 30.0, 0.5)
    widths = []
    for noise in (0.0, 0.01, 0.03):
        g = curves.predicted_gap([run(row, noise, 1)], [run(BASE, noise, 2)], LATER)
        widths.append(g.high - g.low)
    assert widths[0] < widths[1] < widths[2]
    # three base seeds that disagree (each a smooth curve of its own): resampling them widens the interval
    # against their mean as one run
    seeds = [run(saturating(l_inf, 30.0, 0.5)) for l_inf in (1.4, 1.5, 1.6)]
    mean = {s: math.exp(np.mean([math.log(r[s]) for r in seeds])) for s in STEPS}
    three = curves.predicted_gap([run(row)], seeds, LATER)
    one = curves.predicted_gap([run(row)], [mean], LATER)
    assert three.point == pytest.approx(one.point, abs=0.01)
    assert three.high - three.low > one.high - one.low


def test_the_bootstrap_is_seeded():
    rows, base = [run(saturating(1.7, 30.0, 0.5), 0.02, 1)], [run(BASE, 0.02, s) for s in (2, 3)]
    a = curves.predicted_gap(rows, base, LATER, n_boot=100, seed=7)
    b = curves.predicted_gap(rows, base, LATER, n_boot=100, seed=7)
    c = curves.predicted_gap(rows, base, LATER, n_boot=100, seed=8)
    assert (a.low, a.high) == (b.low, b.high) and (a.low, a.high) != (c.low, c.high)
    assert a.point == c.point  # the fit itself draws nothing
    fit = curves.fit_run(rows[0])
    draws = fit.bootstrap([LATER, 2 * LATER], 50, np.random.default_rng(0))
    assert draws.shape == (50, 2) and np.array_equal(draws, fit.bootstrap([LATER, 2 * LATER], 50,
                                                                            np.random.default_rng(0)))
    # the level sets the share of draws the interval covers
    wide = curves.predicted_gap(rows, base, LATER, n_boot=100, seed=7, level=0.99)
    assert wide.low <= a.low and wide.high >= a.high


def test_each_side_is_read_at_its_own_budget_multiple():
    # a row trained 3x the base's steps (big): k x its own budget against k x the base's
    big = run(saturating(1.4, 30.0, 0.5), steps=range(99, 1800, 100))
    assert (verdict.later_step(599, 3), verdict.later_step(1799, 3), verdict.later_step(399, 1.5)) == (1799, 5399, 599)
    v = verdict.curve_verdict([big], [run(BASE)], delta=-1.0, noise="beyond")
    assert (v.gap.at_step, v.gap.base_step) == (5399, 1799)
    assert "at 5400 steps (base 1800); direction bound " in v.why
    # the sweep file's k
    assert verdict.curve_verdict([big], [run(BASE)], -1.0, "beyond", {"k": 2}).gap.base_step == 1199


def test_a_power_law_beyond_exps_range_names_its_amplitude_inf():
    fit = curves.CurveFit("power", (800.0, -1.0), (99, 199, 299), (1.0, 2.0, 3.0))
    assert fit.named() == {"A": math.inf, "alpha": 1.0}


# ----------------------------------------------------------------------------------------------------------
# The interval carries the extrapolation's own error (issue #46)
# ----------------------------------------------------------------------------------------------------------
CASES = {"keeps": saturating(2.3, 30.0, 0.5),     # 0.8 nats worse to the asymptote
         "shrinks": saturating(1.5, 60.0, 0.6),   # worse at the budget, the gap closing (and past zero) by 3x
         "crosses": saturating(2.3, 60.0, 0.8),   # better at the budget, worse from step ~750
         "none": BASE}                            # the base's own law


@pytest.mark.parametrize("noise", [0.02, 0.05])
def test_the_interval_at_3x_covers_the_known_gap_at_its_level_over_seeded_draws(noise):
    draws, covered, boot_only, keeps = 100, {}, {}, 0
    for name, row in CASES.items():
        truth = row(LATER + 1) - BASE(LATER + 1)
        covered[name] = boot_only[name] = 0
        for i in range(draws):
            rng = np.random.default_rng([i, int(noise * 100)])
            g = curves.predicted_gap([run(row, noise, rng.integers(1 << 30))],
                                     [run(BASE, noise, rng.integers(1 << 30)) for _ in range(3)], LATER,
                                     warmup=200, seed=i)
            covered[name] += g.low <= truth <= g.high
            boot_only[name] += g.boot_low <= truth <= g.boot_high
            keeps += name == "keeps" and g.low > 0
            assert g.low <= g.boot_low and g.high >= g.boot_high and g.k == pytest.approx(3.0)
    assert all(c >= curves.EXTRAPOLATION_LEVEL * draws for c in covered.values()), covered   # the stated 80%
    assert keeps >= 0.9 * draws  # and a gap beyond the extrapolation's error still holds: not a band too wide


def test_the_extrapolation_margin_grows_with_log_k_and_is_the_committed_calibration():
    m = curves.extrapolation_margin
    assert m(3.0) == pytest.approx(curves.EXTRAPOLATION_ERROR) and m(1.0) == m(0.5) == 0.0
    assert m(9.0) == pytest.approx(2 * m(3.0)) and m(1.5) == pytest.approx(m(3.0) * math.log(1.5) / math.log(3))
    assert m(3.0, 0.99) > m(3.0) > m(3.0, 0.5)
    # a score is the margin (at 3x) a back-test row needed: widening by it holds the measured gap, exactly
    point, low, high, measured = -0.5, -0.6, -0.4, -0.1
    score = backtest.extrapolation_score(point, low, high, measured, 3.0)
    lo, hi = curves.widen(point, low, high, score)
    assert hi == pytest.approx(measured) and lo < low and backtest.extrapolation_score(point, low, high, -0.45, 3) == 0
    assert backtest.conformal_quantile([0.0] * 6 + [0.2, 0.3], 0.9) == math.inf   # 8 scores: too few for 90%
    assert backtest.conformal_quantile([0.0] * 17 + [0.1, 0.2, 0.3], 0.9) == 0.2


def test_the_settle_budget_of_rows_that_may_flip_names_its_side():
    # better at the budget, its gap closing faster than the bound allows: may flip now; its fitted curves go on
    # closing without crossing by 10x: no settle budget (the committed back-test (c) has a row that holds later:
    # D1, tests/test_backtest.py)
    closing = saturating(1.3, 10.0, 0.5)
    v = verdict.curve_verdict([run(closing)], [run(BASE)], delta=-1.0, noise="beyond")
    assert v.verdict == verdict.MAY_FLIP and v.gap.point < 0 < v.gap.point + v.gap.sign_margin
    assert v.settle is None and verdict.settle_text(v) == "not within 10x"
    st = verdict.Verdict(verdict.MAY_FLIP, "", settle=curves.SettleBudget("holds", 1.5, 899, 899, -1))
    assert verdict.settle_text(st, 2e12, 0.5) == ("holds, better than the base, at 1.5x: 900 steps, 1.8e+15 FLOPs, "
                                                  "0.12 h")
    # the crossing after the budget: a flip, named as one, on the side the row goes to
    crossing = verdict.curve_verdict([run(CASES["crosses"])], [run(BASE)], delta=-0.9, noise="beyond")
    assert crossing.verdict == verdict.MAY_FLIP
    assert crossing.settle.kind == "flips" and crossing.settle.sign == 1 and 1 < crossing.settle.k < 3
    assert verdict.settle_text(crossing).startswith("flips to worse than the base at ")
    # a row within noise gets no settle budget (back-tested, such predictions did no better than saying nothing)
    stalled = verdict.curve_verdict([run(lambda t: 3.1 * t ** -0.02)], [run(BASE)], delta=0.003, noise="within")
    assert stalled.verdict == verdict.WITHIN and stalled.settle is None
    # nothing settles within the multiple looked at: None
    assert curves.settle_budget(crossing.gap, -0.9, most=1.01) is None and verdict.settle_text(None) is None


# ----------------------------------------------------------------------------------------------------------
# The direction (issue #51): synthetic curves with a known future, noise on every validation
# ----------------------------------------------------------------------------------------------------------
EVERY50 = range(49, 600, 50)          # the CPU protocol's validations: every 50 updates to 600


def power(a_coef: float, alpha: float):
    """Dev log-PPL after t updates: A t^-alpha (the verdict's family, so the known future is the fit's)."""
    return lambda t: a_coef * t ** -alpha


P_BASE = power(12.0, 0.25)   # log PPL ~2.4 at 600 updates


def crosses_at(tc: float, ratio: float = 0.93):
    """A row whose curve meets the base's at update ``tc`` after the budget: ``ratio`` x the base's log PPL at
    600 (better when < 1), flatter, so that it crosses."""
    alpha = 0.25 - math.log(ratio) / math.log(tc / 600)
    return power(12.0 * tc ** (alpha - 0.25), alpha)


@pytest.mark.parametrize("name, row, holds_at_least, holds_at_most", [
    ("crosses at 1.5x", crosses_at(900), 0, 0), ("crosses at 2x", crosses_at(1200), 0, 0),
    ("crosses at 2.5x", crosses_at(1500), 0, 0), ("crosses at 2x, from worse", crosses_at(1200, 1.07), 0, 0),
    ("keeps 0.15 nats better", lambda t: P_BASE(t) - 0.15, 0.9, 1.0),
    ("keeps 0.3 nats worse", lambda t: P_BASE(t) + 0.3, 0.9, 1.0)])
def test_no_crossing_row_holds_and_rows_that_keep_their_gap_do(name, row, holds_at_least, holds_at_most):
    truth_now, truth_later = row(600) - P_BASE(600), row(1800) - P_BASE(1800)
    if holds_at_most == 0:  # the known future: on the other side of zero at 3x
        assert truth_now * truth_later < 0
    draws, holds = 30, 0
    for i in range(draws):
        rng = np.random.default_rng([i, 51])
        rows = [run(row, 0.01, rng.integers(1 << 30), steps=EVERY50)]
        base = [run(P_BASE, 0.01, rng.integers(1 << 30), steps=EVERY50) for _ in range(3)]
        now, sd = curves.today_gap(rows, base)
        noise = "beyond" if abs(now) > 2 * sd else "within"
        v = verdict.curve_verdict(rows, base, delta=now, noise=noise, warmup=200, base_warmup=200)
        holds += v.verdict == verdict.HOLDS
    assert holds_at_least * draws <= holds <= holds_at_most * draws, (name, holds)
