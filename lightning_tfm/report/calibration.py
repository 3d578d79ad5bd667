"""The verdict's calibration on the committed back-tests, as a page and as the file the verdict reads: which
back-tests (:data:`CHOSEN_ON`, :data:`HELDOUT_BACKTESTS`, each the export ``backtests.txt`` names for it), their rows
read (:func:`load`), the tables of ``reports/reference/backtest/calibration.md`` (:func:`page_text`) and the held-out
record as it was reported once (:func:`heldout_text`). The maths (each export left out in turn, the constants, the
records) is the findings' (:mod:`lightning_tfm.findings.calibrate`).

``python -m lightning_tfm.report.calibration DIR`` prints the tables; ``--page`` (make rerender) rewrites the
generated part of ``DIR/calibration.md`` and writes the constants and records to
:data:`lightning_tfm.findings.curves.CALIBRATION_FILE`, which the verdict reads; ``tests/test_calibration.py``
checks that the committed file and page are what this computes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..findings import calibrate, curves
from ..findings.calibrate import (
    as_chosen,
    constants,
    direction_by_export,
    directional,
    heldout_record,
    sign_level,
    size_by_export,
    sized,
    targets,
    todays_constants,
)
from ..findings.noise import share

#: The back-tests the constants were first chosen on, before the held-out exports were trained.
CHOSEN_ON = ("b", "c-every50", "d-heldout", "d200-heldout")
#: The held-out back-tests of issue #51: the exports of sweeps/table3-cpu-heldout-{fr,s3,s4}.yaml, trained after
#: the constants were first chosen on :data:`CHOSEN_ON`, each read as (d) and (d200) are (``e-``: steps <= 600
#: predict 1,800; ``e200-``: steps <= 200 predict 600). Reported once with those first constants
#: (:func:`heldout_rows`); the size's error of today is calibrated on them too
#: (:func:`lightning_tfm.findings.calibrate.todays_constants`).
HELDOUT_BACKTESTS = tuple(f"{stage}-heldout-{x}" for x in ("fr", "s3", "s4") for stage in ("e", "e200"))
#: The committed 3x back-tests the constants are calibrated on (reports/reference/backtest/backtest-<name>.json):
#: two stages of one export (cut at 200 and at 600 steps) are one export, left out together.
BACKTESTS = CHOSEN_ON + HELDOUT_BACKTESTS
#: The size levels compared.
SIZE_LEVELS = (0.8, 0.9)


def exports(folder: str | Path) -> dict[str, str]:
    """Each back-test ``folder``'s ``backtests.txt`` lists and the export it reads (its report folder's name, e.g.
    ``table3-cpu-heldout``)."""
    out = {}
    for line in (Path(folder) / "backtests.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _sweep, export, *_ = line.split()
            out[name] = Path(export).parent.name
    return out


def load(folder: str | Path, names=BACKTESTS) -> list[dict]:
    """Every row of the named back-tests in ``folder``, each with its ``export``, ``backtest`` and the ``level``
    of its back-test (the rows :mod:`lightning_tfm.findings.calibrate` reads)."""
    export_of = exports(folder)
    out = []
    for name in names:
        tree = json.loads((Path(folder) / f"backtest-{name}.json").read_text(encoding="utf-8"))
        for r in tree["rows"]:
            out.append({**r, "level": tree["level"], "backtest": name, "export": export_of.get(name, name)})
    return out


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


def heldout_rows(folder: str | Path, first: dict | None = None) -> list[dict]:
    """The held-out back-tests' rows as they were reported, once: with the constants chosen on :data:`CHOSEN_ON`
    (``first``, computed when not given; :func:`as_chosen`), whatever the verdict reads today. Their
    :func:`heldout_record` is :data:`lightning_tfm.findings.curves.HELDOUT_RECORD`."""
    first = first or constants(load(folder, CHOSEN_ON))
    return as_chosen(load(folder, HELDOUT_BACKTESTS), first)


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
    lines += ["", "Constants (findings/calibration.json; the direction's from the rows of " + ", ".join(CHOSEN_ON)
              + ", the size's from every row): " + ", ".join(f"{k} {v:g}" for k, v in c.items()) + "."]
    return "\n".join(lines) + "\n"


def page_text(folder: str | Path) -> str:
    """What ``calibration.md`` holds below its introduction: :func:`text` on the committed back-tests, then
    :func:`heldout_text`, the held-out record as it was reported."""
    first = load(folder, CHOSEN_ON)
    chosen = constants(first)
    return text(first, load(folder)) + "\n" + heldout_text(heldout_rows(folder, chosen), chosen)


def computed(folder: str | Path) -> dict:
    """What :data:`lightning_tfm.findings.curves.CALIBRATION_FILE` holds, from the back-tests in ``folder``
    (:func:`lightning_tfm.findings.calibrate.calibration`)."""
    first = load(folder, CHOSEN_ON)
    return calibrate.calibration(first, load(folder), heldout_rows(folder, constants(first)))


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
        print(f"calibration: {calibrate.write_calibration(computed(folder))}")
    else:
        print(page_text(folder), end="")
