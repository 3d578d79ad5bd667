"""The claim of the Table 2 report (:mod:`.table2`), one line each, for each pair (a transformer row, a row of
another architecture) of its rows (:class:`~.table2.columns.Row`): (a) BLEU at equal training FLOPs, (b) what each
needs to reach the other's final dev BLEU or PPL (:mod:`.table2`'s docstring says how).

A pair's seed noise has one rule, one function (:func:`pair_noise`): the difference of the two rows' means is beyond
seed noise when Welch's 90% t interval of it at the seeds done (the fewer of the two rows', a row) excludes zero
(:func:`lightning_tfm.findings.noise.half_width`), within when it includes zero, unknown with a row of one
seed. A pair within seed noise in (a) gets its prediction of when it would settle (:func:`pair_settle`), as Table
3's rows get theirs (:func:`.verdict.settle_text`): in seeds, the least seeds a row (up to
:data:`~lightning_tfm.findings.noise.SEEDS_MOST`) at which that interval would exclude zero, the measured difference
and seed sds taken as they are (:func:`lightning_tfm.findings.noise.seeds_to_settle`: a plug-in power calculation
under normal seed noise, not back-tested; always more seeds than done, the interval narrowing with seeds); in steps,
Table 3's verdict and settle budget (:func:`.verdict.curve_verdict`) on the pair's dev-PPL curves, the transformer
row as the base (the curve fits are of dev log-PPL, falling curves whose extrapolation error was measured on log-PPL
gaps: BLEU's curves are not fitted). The row, its columns and their views: :mod:`.table2.columns`.
"""
from __future__ import annotations

import math

from ...findings.noise import SEEDS_LEVEL, SEEDS_MOST, finite, half_width, seeds_to_settle
from ..core.text import md_text
from .columns import Row
from .columns import pm as _pm
from .columns import seconds as _seconds

DEFAULT_ARCH = "transformer"
EQUAL_TOLERANCE = 0.05  # two budgets within 5% of the larger are the same budget
SETTLE_NOTE = (
    f"A pair within seed noise, predicted to settle: in seeds, the least seeds a row (up to {SEEDS_MOST}) at which "
    f"Welch's {100 * SEEDS_LEVEL:g}% t interval of the difference of the two rows' means (scipy.stats.t, "
    "Welch-Satterthwaite degrees of freedom) would exclude zero, were today's difference and seed sds the truth: a "
    "plug-in power calculation under normal seed noise, not back-tested (at that count a repeat's interval excludes "
    "zero about half the time); in steps, Table 3's verdict and settle budget on the pair's dev-PPL curves, the "
    "transformer row as the base (back-tested on Table 3's exports only: reports/reference/backtest/; BLEU's curves "
    "are not fitted, the fits are of falling dev log-PPL).")


def has_bleu_curve(row: Row) -> bool:
    """The row's mean dev-BLEU curve has at least two validations (``decode.dev_bleu_every_steps`` logged it)."""
    return len(row.curves["bleu"]) >= 2


def any_bleu_curves(rows: list[dict]) -> bool:
    """Every row with a completed run has a dev-BLEU curve of at least two validations."""
    done = [r for r in rows if r.seeds_completed]
    return bool(done) and all(has_bleu_curve(r) for r in done)


def pair_metric(t: Row, o: Row) -> str:
    """The curves claim (b) of a pair is read on: ``bleu`` when both rows have a dev-BLEU curve, else ``ppl``."""
    return "bleu" if has_bleu_curve(t) and has_bleu_curve(o) else "ppl"


def pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(transformer row, row of another architecture), each such pair in table order."""
    return [(t, o) for t in rows if t.arch == DEFAULT_ARCH for o in rows if o.arch != DEFAULT_ARCH]


def reach(row: Row, metric: str, target: float) -> float | None:
    """The step at which ``row``'s mean ``metric`` curve first reaches ``target`` (BLEU at or above, PPL at or
    below), linear between validations (log PPL for PPL); None when it never does."""
    curve = sorted((s, m) for s, (m, _, _) in row.curves[metric].items())
    better = (lambda x: x >= target) if metric == "bleu" else (lambda x: x <= target)
    scale = (lambda x: x) if metric == "bleu" else (lambda x: math.log(max(x, 1e-12)))
    for i, (s, m) in enumerate(curve):
        if better(m):
            if i == 0:
                return float(s)
            s0, m0 = curve[i - 1]
            gap = scale(m) - scale(m0)
            t = (scale(target) - scale(m0)) / gap if gap else 1.0
            return s0 + min(1.0, max(0.0, t)) * (s - s0)
    return None


def bleu_key(t: Row, o: Row) -> str:
    """The BLEU claim (a) compares: test BLEU when both rows have it, else dev BLEU."""
    return "test_bleu" if t.test_bleu is not None and o.test_bleu is not None else "dev_bleu"


INTERVAL = f"Welch's {100 * SEEDS_LEVEL:g}% t interval of the difference"
#: The pair's noise rule in words (:func:`pair_noise`), for the notes.
PAIR_NOISE_RULE = (f"a pair's difference is beyond seed noise when {INTERVAL} of the two rows' means at the seeds "
                   "done (the fewer of the two rows', a row) excludes zero, within when it includes zero, unknown "
                   "with a row of one completed seed")


def pair_noise(delta: float | None, sd_a: float | None, sd_b: float | None,
               seeds: int) -> tuple[str | None, float | None]:
    """The one noise rule of a Table 2 pair (:data:`PAIR_NOISE_RULE`): (``"beyond"``, ``"within"`` or
    ``"unknown"``, the half-width of the interval at ``seeds`` seeds a row); (None, None) without a difference.
    Its prediction of when a pair within noise settles (:func:`lightning_tfm.findings.noise.seeds_to_settle`) is
    the same interval at more seeds, so a pair within noise is always predicted to settle at more seeds than done."""
    if not finite(delta):
        return None, None
    if not (finite(sd_a) and finite(sd_b)) or seeds < 2:
        return "unknown", None
    half = half_width(sd_a, seeds, sd_b, seeds, SEEDS_LEVEL, "welch")[0]
    return ("beyond" if abs(delta) > half else "within"), half


def noise_text(noise: str | None, half: float | None, seeds: int) -> str:
    """Claim (a)'s words for :func:`pair_noise`'s verdict."""
    if noise == "unknown" or half is None:
        return "seed noise unknown (a row with one completed seed)" if noise == "unknown" else ""
    at = f"{INTERVAL} at {seeds} seeds a row, ±{half:.2f}"
    return (f"beyond seed noise ({at}, excludes zero)" if noise == "beyond" else
            f"within seed noise ({at}, includes zero)")


def pair_settle(t: Row, o: Row, settings: dict | None = None) -> tuple[str | None, str | None, str | None]:
    """(the noise verdict of claim (a)'s BLEU difference (:func:`pair_noise`), and for a pair within noise its
    prediction in seeds and in steps: the module docstring), each None where there is none."""
    key = bleu_key(t, o)
    if not t.seeds_completed or not o.seeds_completed or getattr(t, key) is None or getattr(o, key) is None:
        return None, None, None
    d, have = getattr(t, key) - getattr(o, key), min(t.seeds_completed, o.seeds_completed)
    sds = (getattr(t, f"{key}_std"), getattr(o, f"{key}_std"))
    noise, _ = pair_noise(d, *sds, have)
    if noise != "within":
        return noise, None, None
    n = seeds_to_settle(d, *sds)
    seeds = (f"not within {SEEDS_MOST} seeds a row ({INTERVAL} includes zero up to there)" if n is None else
             f"at {n} seeds a row ({have} now), where {INTERVAL} would exclude zero")
    return noise, seeds, settle_steps(t, o, settings)


def settle_steps(t: Row, o: Row, settings: dict | None = None) -> str:
    """A pair's prediction in steps: Table 3's verdict of ``o`` against ``t`` as its base on their runs' dev-PPL
    curves (:func:`.verdict.curve_verdict`, :func:`.verdict.settle_text`), with Table 2's noise rule."""
    from ..table3.verdict import HOLDS, TOO_FEW, WITHIN, curve_verdict, settle_text

    gap = f"BLEU's curves are not fitted, and the dev-PPL gap of {md_text(o.variant)} to {md_text(t.variant)}"
    if o.dev_ppl is None or t.dev_ppl is None or not o.runs or not t.runs:
        return f"{gap}: not predicted, no dev-PPL curves of both rows' runs"
    d, sds = o.dev_ppl - t.dev_ppl, (o.dev_ppl_std, t.dev_ppl_std)
    noise, _ = pair_noise(d, *sds, min(t.seeds_completed, o.seeds_completed))
    v = curve_verdict(o.runs, t.runs, d, noise, settings, warmup=o.warmup, base_warmup=t.warmup)
    if v.verdict == HOLDS:
        return f"{gap} holds its direction ({v.why}): nothing to settle in steps"
    if v.verdict == WITHIN:  # Table 3's rule: no settle budget for a gap within noise (1 of 5 came true)
        return (f"{gap} is within noise ({v.why}): not predicted in steps (back-tested, such predictions came "
                "true no more often than saying nothing)")
    settle = settle_text(v, o.flops_per_step, o.s_per_step)
    if v.verdict == TOO_FEW or settle is None:
        return f"{gap}: not predicted ({v.why})"
    return f"{gap} may flip ({v.why}); it settles: {settle} ({md_text(t.variant)} as the base)"


def equal_flops_line(t: Row, o: Row, settings: dict | None = None) -> str:
    """Claim (a) for the pair (``t``, ``o``); a pair within seed noise with its prediction (:func:`pair_settle`)."""
    names = f"{md_text(t.variant)} against {md_text(o.variant)}"
    missing = [r.variant for r in (t, o) if not r.seeds_completed]
    if missing:
        return f"(a) BLEU at equal training FLOPs, {names}: not checked, no completed run of {md_text(missing[0])}."
    key = bleu_key(t, o)
    what = "test BLEU" if key == "test_bleu" else "dev BLEU (no test BLEU recorded)"
    if getattr(t, key) is None or getattr(o, key) is None:
        return f"(a) BLEU at equal training FLOPs, {names}: not checked, no BLEU recorded."
    ft, fo = t.train_flops, o.train_flops
    if ft and fo:
        gap = abs(ft - fo) / max(ft, fo)
        budget = (f"at {ft:.3g} and {fo:.3g} training FLOPs, the same budget within {100 * EQUAL_TOLERANCE:.0f}%"
                  if gap <= EQUAL_TOLERANCE else
                  f"NOT at equal training FLOPs ({ft:.3g} against {fo:.3g}, {max(ft, fo) / min(ft, fo):.2f}x)")
    else:
        budget = "training FLOPs unknown"
    d, have = getattr(t, key) - getattr(o, key), min(t.seeds_completed, o.seeds_completed)
    noise, seeds, steps = pair_settle(t, o, settings)
    said = noise_text(noise, pair_noise(d, getattr(t, f"{key}_std"), getattr(o, f"{key}_std"), have)[1], have)
    winner = t if d > 0 else o
    lead = (f"{md_text(winner.variant)} higher by {abs(d):.2f} BLEU" if d else "the same BLEU")
    settle = (f"; predicted to settle (a prediction: the notes say how made): in seeds, {seeds}; in steps, {steps}"
              if seeds else "")
    ours, theirs = (_pm(getattr(r, key), getattr(r, f"{key}_std")) for r in (t, o))
    return (f"(a) BLEU at equal training FLOPs: {md_text(t.variant)} {ours} against {md_text(o.variant)} {theirs} "
            f"{what}, {budget}: {lead}, {said}{settle}.")


def reach_line(t: Row, o: Row, metric: str) -> str:
    """Claim (b) for the pair (``t``, ``o``): what each needs to reach ``o``'s final dev BLEU (or PPL)."""
    what = "dev BLEU" if metric == "bleu" else "dev PPL"
    curve = o.curves[metric]
    if not curve or not t.curves[metric]:
        return (f"(b) {md_text(t.variant)} to reach {md_text(o.variant)}'s final {what}: not checked, no "
                f"{what} curve of {md_text(o.variant if not curve else t.variant)}.")
    target = curve[max(curve)][0]
    if metric == "bleu":
        source = "on the dev-BLEU curves (decode.dev_bleu_every_steps; the first decode.dev_bleu_subset dev sentences)"
    else:
        lacking = " or ".join(md_text(r.variant) for r in (t, o) if not has_bleu_curve(r))
        source = (f"on the dev-PPL curves (no dev-BLEU curve of {lacking}: its runs logged dev BLEU at fewer than "
                  "two validations; decode.dev_bleu_every_steps sets how often)" if lacking else
                  "on the dev-PPL curves")
    parts, cost, bound = [], {}, {}
    for r in (t, o):
        step = reach(r, metric, target)
        f, w = r.flops_per_step, r.s_per_step
        if step is None:
            best = (max if metric == "bleu" else min)(m for m, _, _ in r.curves[metric].values())
            parts.append(f"{md_text(r.variant)} does not reach it within its budget (its best {best:.2f})")
            continue
        cost[r.variant] = (step * f if f else None, step * w if w else None)
        bound[r.variant] = step == min(r.curves[metric])
        at_most = "at most " if bound[r.variant] else ""
        parts.append(f"{md_text(r.variant)} needs {at_most}{cost[r.variant][0] or 0:.3g} FLOPs and {at_most}"
                     f"{_seconds(cost[r.variant][1])} "
                     + (f"(by step {step:.0f}, its first validation: an upper bound)" if at_most else
                        f"(step {step:.0f})"))
    ratio = ""
    if t.variant in cost and o.variant in cost:
        (ft, wt), (fo, wo) = cost[t.variant], cost[o.variant]
        if ft and fo and wt and wo:
            ratio = ": " + fewer(t.variant, o.variant, (ft, wt), (fo, wo), bound[t.variant],
                                 bound[o.variant])
    return (f"(b) To reach {md_text(o.variant)}'s final {what} ({target:.2f}), {source}: "
            + "; ".join(parts) + ratio + ".")


def fewer(a: str, b: str, ca: tuple[float, float], cb: tuple[float, float], a_bound: bool, b_bound: bool) -> str:
    """Claim (b)'s comparison of the costs (FLOPs, wall time) of ``a`` and ``b`` to reach the target. Both measured
    crossings: ``a``'s ratio ("spends 1.15x fewer FLOPs"). A side that reaches the target at its first validation
    has only an upper bound of its cost: a ratio is said only where that bound still decides it ("at least"), else
    "cannot say" (never a ratio of two bounds)."""
    if not (a_bound or b_bound):
        return f"{md_text(a)} spends {cb[0] / ca[0]:.2f}x fewer FLOPs and {cb[1] / ca[1]:.2f}x less wall time"
    said, unsaid = [], []
    for xa, xb, what, less in ((ca[0], cb[0], "FLOPs", "fewer"), (ca[1], cb[1], "wall time", "less")):
        if not b_bound and xb >= xa:  # a's true cost is at most xa
            said.append(f"at least {xb / xa:.2f}x {less} {what}")
        elif not a_bound and xa >= xb:  # b's true cost is at most xb
            said.append(f"at least {xa / xb:.2f}x more {what}")
        else:
            unsaid.append(f"{less} {what}")
    first = [md_text(v) for v, f in ((a, a_bound), (b, b_bound)) if f]
    why = (f"{' and '.join(first)} reach{'es' if len(first) == 1 else ''} it by "
           f"{'its' if len(first) == 1 else 'their'} first validation, where its cost is only an upper bound")
    return "; ".join(([f"{md_text(a)} spends " + " and ".join(said)] if said else [])
                     + ([f"cannot say which spends {' or '.join(unsaid)}"] if unsaid else [])) + f" ({why})"


def claim_lines(rows: list[Row], metric: str | None = None, settings: dict | None = None) -> list[str]:
    """(a) and (b) for each :func:`pairs` pair; (b) on ``metric``'s curves, by default each pair's
    :func:`pair_metric` (the dev-BLEU curves when both rows have one); ``settings``: the verdict's (the sweep
    file's ``report:`` section) for a pair within noise."""
    both = pairs(rows)
    if not both:
        return ["The claim is not checked: the sweep has no transformer row beside a row of another architecture."]
    return [line for t, o in both for line in (equal_flops_line(t, o, settings),
                                               reach_line(t, o, metric or pair_metric(t, o)))]
