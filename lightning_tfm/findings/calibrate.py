"""The verdict's two answers calibrated on back-tests (:mod:`.backtest`'s rows), each on its own question, with
every export left out in turn (issue #51); what :data:`CALIBRATION_FILE` holds and the verdict reads
(:mod:`.curves`):

- **the direction** (*holds*, :func:`.curves.keeps_side`): the one-sided bound's quantile (``SIGN_QUANTILE``) at the
  level ``SIGN_LEVEL``, the lowest of :data:`.curves.SIGN_LEVELS` at which the rows called *holds* with their export
  left out kept their sign at least :data:`.curves.SIGN_TARGET` of the time;
- **the size** (the interval of the gap at 3x): the extrapolation's error (``EXTRAPOLATION_ERROR``) at
  :data:`.curves.EXTRAPOLATION_LEVEL`, the conformal quantile of the rows' scores;
- **the records** the headline quotes: the direction's and the size's, each export left out
  (``DIRECTION_RECORD``, ``SIZE_RECORD``: :func:`record`), the held-out record as it was first reported
  (``HELDOUT_RECORD``: :func:`heldout_record`) and the settle budgets' (``SETTLE_RECORD``: :func:`settle_record`).

A row is a back-test's row as its JSON keeps it (its ``log`` numbers, ``score``, ``sign_score``), with the
``export`` it comes from and the ``level`` of its back-test: rows of one export share its base seeds and its stage
of training, so an export, not a row, is what is left out. Which back-tests the constants are chosen on, and reading
their files: :mod:`lightning_tfm.report.calibration` (``python -m lightning_tfm.report.calibration DIR --page``
writes :data:`CALIBRATION_FILE` with :func:`write_calibration`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist

from . import curves
from .backtest import conformal_quantile, extrapolation_score
from .noise import share
from .verdict import sign

CALIBRATION_FILE = curves.CALIBRATION_FILE


def directional(rows: list[dict]) -> list[dict]:
    """The rows the direction is judged on: beyond seed noise at the cut, with a prediction and a measured gap."""
    return [r for r in rows if r["noise"] == "beyond" and r.get("sign_score") is not None]


def sized(rows: list[dict]) -> list[dict]:
    """The rows the size is judged on: every row with a prediction and a measured gap."""
    return [r for r in rows if r.get("score") is not None and r.get("log")]


def calls(row: dict, quantile: float) -> bool:
    """Whether ``row`` is called *holds* with ``quantile`` (:func:`.curves.keeps_side`)."""
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
        q = conformal_quantile([r["sign_score"] for r in rows if r["export"] != e], level)
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


def _scale(row: dict, level: float) -> float:
    """What rescales the row's bootstrap interval, recorded at its back-test's level, to ``level`` (the normal
    quantiles' ratio)."""
    z = NormalDist().inv_cdf
    return z((1 + level) / 2) / z((1 + row["level"]) / 2)


def interval_at(row: dict, error: float, level: float) -> tuple[float, float]:
    """The row's interval of the gap at ``level`` with the extrapolation ``error`` (at 3x): its bootstrap interval
    rescaled to ``level`` (:func:`_scale`), widened in quadrature as :func:`.curves.widen` widens it."""
    g, scale = row["log"], _scale(row, level)
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
        error = conformal_quantile([_score_at(r, level) for r in others], level)
        mine = [r for r in rows if r["export"] == e]
        spans = [interval_at(r, error, level) for r in mine]
        inside = sum(lo <= r["log"]["measured"] <= hi for r, (lo, hi) in zip(mine, spans))
        out[e] = (error, inside, len(mine), sum(hi - lo for lo, hi in spans) / len(mine))
    return out


def _score_at(row: dict, level: float) -> float:
    """The row's score (:func:`.backtest.extrapolation_score`) with its bootstrap interval at ``level``."""
    g, scale = row["log"], _scale(row, level)
    return extrapolation_score(g["point"], g["point"] - (g["point"] - g["boot_low"]) * scale,
                               g["point"] + (g["boot_high"] - g["point"]) * scale, g["measured"], g["k"])


def constants(rows: list[dict]) -> dict:
    """The constants computed from every row: ``SIGN_LEVEL``, ``SIGN_QUANTILE``, ``EXTRAPOLATION_ERROR`` (at
    ``EXTRAPOLATION_LEVEL``), rounded to 4 decimals."""
    level = sign_level(rows)
    return {"SIGN_LEVEL": level,
            "SIGN_QUANTILE": round(conformal_quantile([r["sign_score"] for r in directional(rows)], level), 4),
            "EXTRAPOLATION_ERROR": round(conformal_quantile(
                [_score_at(r, curves.EXTRAPOLATION_LEVEL) for r in sized(rows)], curves.EXTRAPOLATION_LEVEL), 4)}


def todays_constants(first: list[dict], every: list[dict]) -> dict:
    """The verdict's constants: the direction's ``SIGN_LEVEL`` and ``SIGN_QUANTILE`` as first chosen, on the rows
    of the back-tests before the held-out exports (``first``; held out, their calls met the targets, so they were
    kept), and the size's ``EXTRAPOLATION_ERROR`` from the rows of every back-test (``every``; held out, the first
    error's intervals missed, so it is recalibrated on them too)."""
    return {**{k: v for k, v in constants(first).items() if k != "EXTRAPOLATION_ERROR"},
            "EXTRAPOLATION_ERROR": constants(every)["EXTRAPOLATION_ERROR"]}


def record(first: list[dict], every: list[dict]) -> dict:
    """The cross-validated record the headline quotes, at the chosen levels, on the rows each constant is
    calibrated on (:func:`todays_constants`): ``{"holds": (beyond noise, called, kept), "size": (inside, rows)}``."""
    by = size_by_export(every, curves.EXTRAPOLATION_LEVEL)
    return {"holds": totals(direction_by_export(first, sign_level(first))),
            "size": (sum(v[1] for v in by.values()), sum(v[2] for v in by.values()))}


def heldout_record(rows: list[dict]) -> dict:
    """The verdict's record on back-tests as the report printed them (each row's ``verdict``, ``sign_kept`` and
    ``inside``; with other constants, as :func:`as_chosen` restates them): ``{"holds": (beyond noise, called,
    kept), "size": (inside, rows predicted)}``."""
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


def settle_record(rows: list[dict]) -> dict:
    """Of each kind of settle budget predicted by 3x (its ``k`` at most 3), (came true, predicted): beyond seed noise
    at 3x on the side it named."""
    out = {kind: [0, 0] for kind in ("holds", "flips")}
    for r in rows:
        st = r.get("settle") or {}
        if st.get("kind") in out and st["k"] <= curves.EXTRAPOLATION_K and r.get("log"):
            out[st["kind"]][1] += 1
            out[st["kind"]][0] += r["noise_later"] == "beyond" and sign(r["log"]["measured"]) == st["sign"]
    return {k: tuple(v) for k, v in out.items()}


def calibration(first: list[dict], every: list[dict], heldout: list[dict]) -> dict:
    """What :data:`CALIBRATION_FILE` holds, from the rows of the back-tests the direction was first chosen on
    (``first``), of every back-test (``every``) and of the held-out ones as first reported (``heldout``:
    :func:`as_chosen` with the first constants): the constants (:func:`todays_constants`) and the records."""
    rec, held = record(first, every), heldout_record(heldout)
    return {**todays_constants(first, every), "DIRECTION_RECORD": list(rec["holds"]), "SIZE_RECORD": list(rec["size"]),
            "HELDOUT_RECORD": {k: list(v) for k, v in held.items()},
            "SETTLE_RECORD": {k: list(v) for k, v in settle_record(every).items()}}


def write_calibration(values: dict, path: str | Path = CALIBRATION_FILE) -> Path:
    """``values`` (:func:`calibration`) as the JSON file the verdict reads (:data:`.curves.CALIBRATION_FILE`)."""
    from ..base.atomic import write_text

    return write_text(Path(path), json.dumps(values, indent=1) + "\n")
