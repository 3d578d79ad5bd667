"""The verdict's two answers calibrated on the committed back-tests, each on its own question, with every export
left out in turn (issue #51):

- **the direction** (*holds*, :func:`lightning_tfm.findings.curves.keeps_side`): the one-sided bound's quantile
  (``SIGN_QUANTILE``) at the level ``SIGN_LEVEL``, the lowest of ``SIGN_LEVELS`` at which the rows called *holds*
  with their export left out kept their sign at least ``SIGN_TARGET`` of the time, chosen on the back-tests of
  :data:`CHOSEN_ON` and kept, since its calls met their targets on the held-out exports (:data:`HELDOUT_BACKTESTS`);
- **the size** (the interval of the gap at 3x): the extrapolation's error (``EXTRAPOLATION_ERROR``) at
  ``EXTRAPOLATION_LEVEL``, with the coverage each level gets with its export left out, on every back-test: first
  chosen on :data:`CHOSEN_ON`, its intervals missed on the held-out exports, so it is recalibrated on them too.

Its input is the back-tests' JSON (``ltfm report ... --backtest ... --out F.json``; their per-row ``log`` numbers,
``score`` and ``sign_score``), grouped by the export they come from (:data:`BACKTESTS`): rows of one export share
its base seeds and its stage of training, so an export, not a row, is what is left out. Conformal quantiles as
:func:`lightning_tfm.findings.curves.conformal_quantile`. ``python -m lightning_tfm.report.calibration DIR`` prints
the tables (``reports/reference/backtest/calibration.md``); ``tests/test_calibration.py`` checks that the
constants of ``findings/curves.py`` and the records the headline quotes are what this computes.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from statistics import NormalDist

from ..findings import curves
from ..findings.verdict import sign
from .table3.stats import share

#: The held-out back-tests of issue #51: the exports of sweeps/table3-cpu-heldout-{fr,s3,s4}.yaml, trained after
#: the constants were first chosen on :data:`CHOSEN_ON`, each read as (d) and (d200) are (``e-``: steps <= 600
#: predict 1,800; ``e200-``: steps <= 200 predict 600). Reported once with those first constants
#: (:func:`heldout_rows`); the size's error of today is calibrated on them too (:func:`todays_constants`).
HELDOUT = ("fr", "s3", "s4")
HELDOUT_BACKTESTS = {f"{stage}-heldout-{x}": f"table3-cpu-heldout-{x}" for x in HELDOUT for stage in ("e", "e200")}
#: The back-tests the constants were first chosen on, before the held-out exports were trained.
CHOSEN_ON = {"b": "table3-cpu-2026-11-25", "c-every50": "table3-cpu", "d-heldout": "table3-cpu-heldout",
             "d200-heldout": "table3-cpu-heldout"}
#: The committed 3x back-tests the constants of findings/curves.py are calibrated on
#: (reports/reference/backtest/backtest-<name>.json) and the export each reads: two stages of one export (cut at
#: 200 and at 600 steps) are one export, left out together.
BACKTESTS = {**CHOSEN_ON, **HELDOUT_BACKTESTS}
#: The size levels compared.
SIZE_LEVELS = (0.8, 0.9)

def load(folder: str | Path, names=tuple(BACKTESTS)) -> list[dict]:
    """Every row of the named back-tests in ``folder``, each with its ``export`` and ``backtest``."""
    out = []
    for name in names:
        tree = json.loads((Path(folder) / f"backtest-{name}.json").read_text(encoding="utf-8"))
        for r in tree["rows"]:
            out.append({**r, "level": tree["level"], "backtest": name,
                        "export": {**BACKTESTS, **HELDOUT_BACKTESTS}.get(name, name)})
    return out


def directional(rows: list[dict]) -> list[dict]:
    """The rows the direction is judged on: beyond seed noise at the cut, with a prediction and a measured gap."""
    return [r for r in rows if r["noise"] == "beyond" and r.get("sign_score") is not None]


def sized(rows: list[dict]) -> list[dict]:
    """The rows the size is judged on: every row with a prediction and a measured gap."""
    return [r for r in rows if r.get("score") is not None and r.get("log")]


def calls(row: dict, quantile: float) -> bool:
    """Whether ``row`` is called *holds* with ``quantile`` (:func:`lightning_tfm.findings.curves.keeps_side`)."""
    g = row["log"]
    side = sign(g["now"])
    return bool(side) and side * g["point"] - curves.direction_margin(g["now"], g["noise_sd"], g["k"], quantile) > 0


def kept(row: dict) -> bool:
    return sign(row["log"]["measured"]) == sign(row["log"]["now"])


def direction_by_export(rows: list[dict], level: float) -> dict:
    """Each export left out in turn: the quantile from the others' rows, the rows of this one it calls *holds* and
    how many of those kept their sign. ``{export: (quantile, beyond noise, called, kept)}``."""
    rows = directional(rows)
    out = {}
    for e in dict.fromkeys(r["export"] for r in rows):
        q = curves.conformal_quantile([r["sign_score"] for r in rows if r["export"] != e], level)
        mine = [r for r in rows if r["export"] == e]
        called = [r for r in mine if calls(r, q)]
        out[e] = (q, len(mine), len(called), sum(map(kept, called)))
    return out


def sign_level(rows: list[dict]) -> float:
    """The lowest of ``SIGN_LEVELS`` whose rows called *holds*, each export left out, kept their sign at least
    ``SIGN_TARGET`` of the time (the highest level when none does)."""
    for level in curves.SIGN_LEVELS:
        _, called, kept_ = totals(direction_by_export(rows, level))
        if called and kept_ >= curves.SIGN_TARGET * called:
            return level
    return curves.SIGN_LEVELS[-1]


def totals(by_export: dict) -> tuple[int, int, int]:
    """The sums over exports of :func:`direction_by_export`'s (beyond noise, called, kept)."""
    return tuple(sum(v[i] for v in by_export.values()) for i in (1, 2, 3))


def interval_at(row: dict, error: float, level: float) -> tuple[float, float]:
    """The row's interval of the gap at ``level`` with the extrapolation ``error`` (at 3x): its bootstrap interval
    (recorded at the back-test's level, rescaled to ``level`` by the normal quantiles) widened in quadrature."""
    g = row["log"]
    z = NormalDist().inv_cdf
    scale = z((1 + level) / 2) / z((1 + row["level"]) / 2)
    margin = error * math.log(g["k"]) / math.log(curves.EXTRAPOLATION_K)
    return (g["point"] - math.hypot((g["point"] - g["boot_low"]) * scale, margin),
            g["point"] + math.hypot((g["boot_high"] - g["point"]) * scale, margin))


def size_by_export(rows: list[dict], level: float) -> dict:
    """Each export left out in turn: the extrapolation's error from the others' scores (rescaled to ``level``),
    and how many of this one's measured gaps fell inside. ``{export: (error, inside, rows, mean width)}``."""
    rows = sized(rows)
    out = {}
    for e in dict.fromkeys(r["export"] for r in rows):
        others = [r for r in rows if r["export"] != e]
        error = curves.conformal_quantile([_score_at(r, level) for r in others], level)
        mine = [r for r in rows if r["export"] == e]
        spans = [interval_at(r, error, level) for r in mine]
        inside = sum(lo <= r["log"]["measured"] <= hi for r, (lo, hi) in zip(mine, spans))
        out[e] = (error, inside, len(mine), sum(hi - lo for lo, hi in spans) / len(mine))
    return out


def _score_at(row: dict, level: float) -> float:
    """The row's score (:func:`lightning_tfm.findings.curves.extrapolation_score`) with its bootstrap interval at
    ``level``."""
    g = row["log"]
    z = NormalDist().inv_cdf
    scale = z((1 + level) / 2) / z((1 + row["level"]) / 2)
    return curves.extrapolation_score(g["point"], g["point"] - (g["point"] - g["boot_low"]) * scale,
                                      g["point"] + (g["boot_high"] - g["point"]) * scale, g["measured"], g["k"])


def constants(rows: list[dict]) -> dict:
    """What findings/curves.py holds, computed from every row: ``SIGN_LEVEL``, ``SIGN_QUANTILE``,
    ``EXTRAPOLATION_ERROR`` (at ``EXTRAPOLATION_LEVEL``), rounded as the code keeps them."""
    level = sign_level(rows)
    return {"SIGN_LEVEL": level,
            "SIGN_QUANTILE": round(curves.conformal_quantile([r["sign_score"] for r in directional(rows)], level), 4),
            "EXTRAPOLATION_ERROR": round(curves.conformal_quantile(
                [_score_at(r, curves.EXTRAPOLATION_LEVEL) for r in sized(rows)], curves.EXTRAPOLATION_LEVEL), 4)}


def todays_constants(first: list[dict], every: list[dict]) -> dict:
    """What findings/curves.py holds: the direction's ``SIGN_LEVEL`` and ``SIGN_QUANTILE`` as first chosen, on the rows
    of :data:`CHOSEN_ON` (``first``; held out, their calls met the targets, so they were kept), and the size's
    ``EXTRAPOLATION_ERROR`` from the rows of every back-test (``every``; held out, the first error's intervals
    missed, so it is recalibrated on them too)."""
    return {**{k: v for k, v in constants(first).items() if k != "EXTRAPOLATION_ERROR"},
            "EXTRAPOLATION_ERROR": constants(every)["EXTRAPOLATION_ERROR"]}


def record(first: list[dict], every: list[dict]) -> dict:
    """The cross-validated record the headline quotes (:data:`lightning_tfm.findings.curves.DIRECTION_RECORD` and
    ``SIZE_RECORD``), at the chosen levels, on the rows each constant is calibrated on
    (:func:`todays_constants`): ``{"holds": (beyond noise, called, kept), "size": (inside, rows)}``."""
    by = size_by_export(every, curves.EXTRAPOLATION_LEVEL)
    return {"holds": totals(direction_by_export(first, sign_level(first))),
            "size": (sum(v[1] for v in by.values()), sum(v[2] for v in by.values()))}


def heldout_record(rows: list[dict]) -> dict:
    """The verdict's record on back-tests as the report printed them (each row's ``verdict``, ``sign_kept`` and
    ``inside``; with other constants, as :func:`as_chosen` restates them): ``{"holds": (beyond noise, called,
    kept), "size": (inside, rows predicted)}``; of :func:`heldout_rows`, what
    :data:`lightning_tfm.findings.curves.HELDOUT_RECORD` holds."""
    beyond = [r for r in rows if r["noise"] == "beyond"]
    called = [r for r in beyond if r["verdict"] == "holds"]
    predicted = [r for r in rows if r["inside"] is not None]
    return {"holds": (len(beyond), len(called), sum(bool(r["sign_kept"]) for r in called)),
            "size": (sum(bool(r["inside"]) for r in predicted), len(predicted))}


def targets(rec: dict) -> list[tuple[str, str, str, bool]]:
    """The issue's targets for a record (:func:`record`, :func:`heldout_record`): (what, measured, target, met)."""
    beyond, called, kept_ = rec["holds"]
    inside, n = rec["size"]
    level = curves.EXTRAPOLATION_LEVEL
    return [("rows beyond noise called *holds*", share(called, beyond), "at least 2/3",
             bool(beyond) and called >= 2 / 3 * beyond),
            ("*holds* that kept their sign at 3x", share(kept_, called), f"at least {100 * curves.SIGN_TARGET:g}%",
             bool(called) and kept_ >= curves.SIGN_TARGET * called),
            (f"measured gaps inside their {100 * level:g}% interval", share(inside, n),
             f"{100 * level - 10:g}-{100 * level + 10:g}%", bool(n) and abs(inside / n - level) <= 0.10 + 1e-12)]


def misses(rows: list[dict]) -> list[str]:
    """The rows that missed, one line each: a *holds* whose sign did not keep, a measured gap outside its interval."""
    out = []
    for r in rows:
        where = f"{r['backtest']} {r['variant']}: predicted {_pct(r['predicted'])} [{_pct(r['low'])}, " \
                f"{_pct(r['high'])}], measured {_pct(r['measured'])}"
        if r["verdict"] == "holds" and r["sign_kept"] is False:
            out.append(f"{where}, called *holds* at {_pct(r['change'])}: its sign did not keep")
        elif r["inside"] is False:
            out.append(f"{where}: outside its interval")
    return out


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:+.1f}%"


def as_chosen(rows: list[dict], chosen: dict) -> list[dict]:
    """The rows as their back-tests would have printed them with the constants ``chosen`` (:func:`constants`'
    keys): each verdict of a row beyond noise (*holds* or *may flip*), each interval (``low``, ``high``) and whether
    it held the measured gap (``inside``), recomputed from the row's log numbers, which no constant changes."""
    out = []
    for r in rows:
        g = r.get("log")
        if not g:
            out.append(r)
            continue
        r = dict(r)
        if r["noise"] == "beyond":
            r["verdict"] = "holds" if calls(r, chosen["SIGN_QUANTILE"]) else "may flip"
        lo, hi = interval_at(r, chosen["EXTRAPOLATION_ERROR"], curves.EXTRAPOLATION_LEVEL)
        r["low"], r["high"] = round(math.expm1(lo), 4), round(math.expm1(hi), 4)
        if r["inside"] is not None:
            r["inside"] = lo <= g["measured"] <= hi
        out.append(r)
    return out


def heldout_rows(folder: str | Path, first: dict | None = None) -> list[dict]:
    """The held-out back-tests' rows as they were reported, once: with the constants chosen on :data:`CHOSEN_ON`
    (``first``, computed when not given; :func:`as_chosen`), whatever findings/curves.py holds today. Their
    :func:`heldout_record` is :data:`lightning_tfm.findings.curves.HELDOUT_RECORD`."""
    first = first or constants(load(folder, tuple(CHOSEN_ON)))
    return as_chosen(load(folder, tuple(HELDOUT_BACKTESTS)), first)


def heldout_text(rows: list[dict], first: dict) -> str:
    """The held-out section of ``calibration.md`` (``rows``: :func:`heldout_rows`; ``first``: the constants they
    were reported with): each back-test's counts, the totals against the targets, and every row that missed."""
    lines = ["## Held out, reported once: the exports trained after the first choice", "",
             "The constants as first chosen (on " + ", ".join(CHOSEN_ON) + ": "
             + ", ".join(f"{k} {v:g}" for k, v in first.items()) + ") on back-tests of exports trained after that "
             "choice (sweeps/table3-cpu-heldout-{fr,s3,s4}.yaml: en->fr, and the CPU protocol's rows at seeds 3 and "
             "4, each with its own 3 base seeds; e-: steps <= 600 predict 1,800, e200-: steps <= 200 predict 600). "
             "The direction's constants are today's; the size's error (above) is recalibrated on these rows too, so "
             "its record here is of the first one.", "",
             "| back-test | export | rows beyond noise | called *holds* | kept their sign | inside the interval |",
             "|---|---|--:|--:|--:|--:|"]
    for name in dict.fromkeys(r["backtest"] for r in rows):
        mine = [r for r in rows if r["backtest"] == name]
        rec = heldout_record(mine)
        lines.append(f"| {name} | {mine[0]['export']} | {rec['holds'][0]} | {rec['holds'][1]} | {rec['holds'][2]} "
                     f"| {rec['size'][0]}/{rec['size'][1]} |")
    lines += ["", "| target | held out | target | met |", "|---|---|---|---|"]
    lines += [f"| {what} | {got} | {want} | {'yes' if ok else 'no'} |"
              for what, got, want, ok in targets(heldout_record(rows))]
    missed = misses(rows)
    lines += ["", "Rows that missed" + (" (their curves: each back-test's `backtest-<name>.png` beside this page, "
                                        "its bands drawn with today's error):" if missed else ": none.")]
    lines += [f"- {m}" for m in missed]
    return "\n".join(lines) + "\n"


def settle_record(rows: list[dict]) -> dict:
    """Of each kind of settle budget predicted by 3x (``settle["k"] <= 3``), (came true, predicted): beyond seed
    noise at 3x on the side it named (:data:`lightning_tfm.findings.curves.SETTLE_RECORD`)."""
    out = {kind: [0, 0] for kind in curves.SETTLE_RECORD}
    for r in rows:
        st = r.get("settle") or {}
        if st.get("kind") in out and st["k"] <= curves.EXTRAPOLATION_K and r.get("log"):
            out[st["kind"]][1] += 1
            out[st["kind"]][0] += r["noise_later"] == "beyond" and sign(r["log"]["measured"]) == st["sign"]
    return {k: tuple(v) for k, v in out.items()}


def text(first: list[dict], every: list[dict]) -> str:
    """The tables of ``calibration.md``, each export left out: the direction's levels on the rows it was chosen on
    (``first``), the size's on every row (``every``), and the constants (:func:`todays_constants`)."""
    lines = ["## The direction (*holds*): the one-sided bound's level, each export left out, on the rows it was "
             "chosen on", "",
             "| level | " + " | ".join(dict.fromkeys(r["export"] for r in directional(first)))
             + " | called of beyond noise | kept their sign |", "|---|" + "---|" * (
                 len(set(r["export"] for r in directional(first))) + 2)]
    for level in curves.SIGN_LEVELS:
        by = direction_by_export(first, level)
        n, c, k = (sum(v[i] for v in by.values()) for i in (1, 2, 3))
        cells = " | ".join(f"{v[2]}/{v[1]} (q {v[0]:.2f})" for v in by.values())
        lines.append(f"| {100 * level:g}% | {cells} | {share(c, n)} | {share(k, c)} |")
    lines += ["", f"Chosen: {100 * sign_level(first):g}% (the lowest level whose calls kept their sign at least "
              f"{100 * curves.SIGN_TARGET:g}% of the time).", "",
              "## The size: the interval's level, each export left out, on every row", "",
              "| level | " + " | ".join(dict.fromkeys(r["export"] for r in sized(every)))
              + " | inside | mean width (nats) |", "|---|" + "---|" * (len(set(r["export"] for r in sized(every))) + 2)]
    for level in SIZE_LEVELS:
        by = size_by_export(every, level)
        inside, n = (sum(v[i] for v in by.values()) for i in (1, 2))
        width = sum(v[3] * v[2] for v in by.values()) / n
        cells = " | ".join(f"{v[1]}/{v[2]} (error {v[0]:.2f})" for v in by.values())
        lines.append(f"| {100 * level:g}% | {cells} | {share(inside, n)} | {width:.2f} |")
    c = todays_constants(first, every)
    lines += ["", "Constants (findings/curves.py; the direction's from the rows of " + ", ".join(CHOSEN_ON)
              + ", the size's from every row): " + ", ".join(f"{k} {v:g}" for k, v in c.items()) + "."]
    return "\n".join(lines) + "\n"


def page_text(folder: str | Path) -> str:
    """What ``calibration.md`` holds below its introduction: :func:`text` on the committed back-tests, then
    :func:`heldout_text`, the held-out record as it was reported."""
    first = load(folder, tuple(CHOSEN_ON))
    chosen = constants(first)
    return text(first, load(folder)) + "\n" + heldout_text(heldout_rows(folder, chosen), chosen)


#: Where the generated part of ``calibration.md`` starts and where the hand-written part below it starts.
PAGE_MARKS = ("## The direction (*holds*)", "## What this shows")


def write_page(folder: str | Path) -> Path:
    """``folder``'s ``calibration.md`` with its generated part (between :data:`PAGE_MARKS`) replaced by
    :func:`page_text` (make rerender); the hand-written text above and below stays."""
    from ..base.atomic import write_text

    page = Path(folder) / "calibration.md"
    text = page.read_text(encoding="utf-8")
    head, rest = text.split(PAGE_MARKS[0], 1)
    tail = PAGE_MARKS[1] + rest.split(PAGE_MARKS[1], 1)[1] if PAGE_MARKS[1] in rest else ""
    return write_text(page, head + page_text(folder) + ("\n" + tail if tail else ""))


if __name__ == "__main__":  # python -m lightning_tfm.report.calibration reports/reference/backtest [--page]
    folder = next((a for a in sys.argv[1:] if a != "--page"), "reports/reference/backtest")
    if "--page" in sys.argv[1:]:
        print(f"calibration: {write_page(folder)}")
    else:
        print(page_text(folder), end="")
