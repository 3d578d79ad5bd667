"""The verdict's two answers calibrated on the committed back-tests, each on its own question, with every export
left out in turn (issue #51):

- **the direction** (*holds*, :func:`lightning_tfm.sweep.curves.keeps_side`): the one-sided bound's quantile
  (``SIGN_QUANTILE``) at the level ``SIGN_LEVEL``, the lowest of ``SIGN_LEVELS`` at which the rows called *holds*
  with their export left out kept their sign at least ``SIGN_TARGET`` of the time;
- **the size** (the interval of the gap at 3x): the extrapolation's error (``EXTRAPOLATION_ERROR``) at
  ``EXTRAPOLATION_LEVEL``, with the coverage each level gets with its export left out.

Its input is the back-tests' JSON (``ltfm report ... --backtest ... --out F.json``; their per-row ``log`` numbers,
``score`` and ``sign_score``), grouped by the export they come from (:data:`BACKTESTS`): rows of one export share
its base seeds and its stage of training, so an export, not a row, is what is left out. Conformal quantiles as
:func:`lightning_tfm.sweep.curves.conformal_quantile`. ``python -m lightning_tfm.report.calibration DIR`` prints
the tables (``reports/reference/backtest/calibration.md``); ``tests/test_calibration.py`` checks that the
constants of ``sweep/curves.py`` and the records the headline quotes are what this computes.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from statistics import NormalDist

from ..sweep import curves
from .table3.stats import share

#: The committed 3x back-tests (reports/reference/backtest/backtest-<name>.json) and the export each reads: two
#: stages of one export (the held-out runs cut at 200 and at 600 steps) are one export.
BACKTESTS = {"b": "table3-cpu-2026-11-25", "c-every50": "table3-cpu", "d-heldout": "table3-cpu-heldout",
             "d200-heldout": "table3-cpu-heldout"}
#: The size levels compared.
SIZE_LEVELS = (0.8, 0.9)

def load(folder: str | Path, names=tuple(BACKTESTS)) -> list[dict]:
    """Every row of the named back-tests in ``folder``, each with its ``export`` and ``backtest``."""
    out = []
    for name in names:
        tree = json.loads((Path(folder) / f"backtest-{name}.json").read_text(encoding="utf-8"))
        for r in tree["rows"]:
            out.append({**r, "level": tree["level"], "backtest": name, "export": BACKTESTS.get(name, name)})
    return out


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def directional(rows: list[dict]) -> list[dict]:
    """The rows the direction is judged on: beyond seed noise at the cut, with a prediction and a measured gap."""
    return [r for r in rows if r["noise"] == "beyond" and r.get("sign_score") is not None]


def sized(rows: list[dict]) -> list[dict]:
    """The rows the size is judged on: every row with a prediction and a measured gap."""
    return [r for r in rows if r.get("score") is not None and r.get("log")]


def calls(row: dict, quantile: float) -> bool:
    """Whether ``row`` is called *holds* with ``quantile`` (:func:`lightning_tfm.sweep.curves.keeps_side`)."""
    g = row["log"]
    sign = _sign(g["now"])
    return bool(sign) and sign * g["point"] - curves.direction_margin(g["now"], g["noise_sd"], g["k"], quantile) > 0


def kept(row: dict) -> bool:
    return _sign(row["log"]["measured"]) == _sign(row["log"]["now"])


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
    """The row's score (:func:`lightning_tfm.sweep.curves.extrapolation_score`) with its bootstrap interval at
    ``level``."""
    g = row["log"]
    z = NormalDist().inv_cdf
    scale = z((1 + level) / 2) / z((1 + row["level"]) / 2)
    return curves.extrapolation_score(g["point"], g["point"] - (g["point"] - g["boot_low"]) * scale,
                                      g["point"] + (g["boot_high"] - g["point"]) * scale, g["measured"], g["k"])


def constants(rows: list[dict]) -> dict:
    """What sweep/curves.py holds, computed from every row: ``SIGN_LEVEL``, ``SIGN_QUANTILE``,
    ``EXTRAPOLATION_ERROR`` (at ``EXTRAPOLATION_LEVEL``), rounded as the code keeps them."""
    level = sign_level(rows)
    return {"SIGN_LEVEL": level,
            "SIGN_QUANTILE": round(curves.conformal_quantile([r["sign_score"] for r in directional(rows)], level), 4),
            "EXTRAPOLATION_ERROR": round(curves.conformal_quantile(
                [_score_at(r, curves.EXTRAPOLATION_LEVEL) for r in sized(rows)], curves.EXTRAPOLATION_LEVEL), 4)}


def record(rows: list[dict]) -> dict:
    """The cross-validated record the headline quotes (:data:`lightning_tfm.sweep.curves.DIRECTION_RECORD` and
    ``SIZE_RECORD``), at the chosen levels: ``{"holds": (beyond noise, called, kept), "size": (inside, rows)}``."""
    by = size_by_export(rows, curves.EXTRAPOLATION_LEVEL)
    return {"holds": totals(direction_by_export(rows, sign_level(rows))),
            "size": (sum(v[1] for v in by.values()), sum(v[2] for v in by.values()))}


def settle_record(rows: list[dict]) -> dict:
    """Of each kind of settle budget predicted by 3x (``settle["k"] <= 3``), (came true, predicted): beyond seed
    noise at 3x on the side it named (:data:`lightning_tfm.sweep.curves.SETTLE_RECORD`)."""
    out = {kind: [0, 0] for kind in curves.SETTLE_RECORD}
    for r in rows:
        st = r.get("settle") or {}
        if st.get("kind") in out and st["k"] <= curves.EXTRAPOLATION_K and r.get("log"):
            out[st["kind"]][1] += 1
            out[st["kind"]][0] += r["noise_later"] == "beyond" and _sign(r["log"]["measured"]) == st["sign"]
    return {k: tuple(v) for k, v in out.items()}


def text(rows: list[dict]) -> str:
    """The tables of ``calibration.md``: the direction's levels and the size's, each export left out."""
    lines = ["## The direction (*holds*): the one-sided bound's level, each export left out", "",
             "| level | " + " | ".join(dict.fromkeys(r["export"] for r in directional(rows)))
             + " | called of beyond noise | kept their sign |", "|---|" + "---|" * (
                 len(set(r["export"] for r in directional(rows))) + 2)]
    for level in curves.SIGN_LEVELS:
        by = direction_by_export(rows, level)
        n, c, k = (sum(v[i] for v in by.values()) for i in (1, 2, 3))
        cells = " | ".join(f"{v[2]}/{v[1]} (q {v[0]:.2f})" for v in by.values())
        lines.append(f"| {100 * level:g}% | {cells} | {share(c, n)} | {share(k, c)} |")
    lines += ["", f"Chosen: {100 * sign_level(rows):g}% (the lowest level whose calls kept their sign at least "
              f"{100 * curves.SIGN_TARGET:g}% of the time).", "",
              "## The size: the interval's level, each export left out", "",
              "| level | " + " | ".join(dict.fromkeys(r["export"] for r in sized(rows)))
              + " | inside | mean width (nats) |", "|---|" + "---|" * (len(set(r["export"] for r in sized(rows))) + 2)]
    for level in SIZE_LEVELS:
        by = size_by_export(rows, level)
        inside, n = (sum(v[i] for v in by.values()) for i in (1, 2))
        width = sum(v[3] * v[2] for v in by.values()) / n
        cells = " | ".join(f"{v[1]}/{v[2]} (error {v[0]:.2f})" for v in by.values())
        lines.append(f"| {100 * level:g}% | {cells} | {share(inside, n)} | {width:.2f} |")
    c = constants(rows)
    lines += ["", "Constants from every row (sweep/curves.py): " + ", ".join(f"{k} {v:g}" for k, v in c.items()) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m lightning_tfm.report.calibration reports/reference/backtest
    print(text(load(sys.argv[1] if len(sys.argv) > 1 else "reports/reference/backtest")), end="")
