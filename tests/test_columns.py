"""A report column is one entry of one list (lightning_tfm/report/table3/columns.py): a column added there alone,
computed from the typed row, shows in table3.md, table3.csv, the report's W&B table (read back from the offline run's
files) and the study's optuna-dashboard note. The report is rebuilt in-process from the committed CPU reference's
export."""
from __future__ import annotations

import csv
import dataclasses
import io

import pytest

from lightning_tfm import report as rd
from lightning_tfm.report.core.columns import CSV, Column, Shown
from lightning_tfm.report.publish import kinds, optuna_note, wandb_run
from lightning_tfm.report.table3 import columns
from lightning_tfm.report.table3.columns import NOTE, PPL, WANDB_PPL, Row
from lightning_tfm.report.views.render import table_csv, write_table
from lightning_tfm.sweep import load_sweep

from conftest import ROOT
from wandb_offline import read_runs

SWEEP = ROOT / "sweeps" / "table3-cpu.yaml"
EXPORT = ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export"


def ppl_per_mparam(row: Row) -> float | None:
    return None if row.dev_ppl is None or not row.params else row.dev_ppl / (row.params / 1e6)


# What a contributor writes: one entry, appended to columns.COLUMNS
NEW = Column("ppl_per_mparam", "dev PPL per million parameters", frozenset({CSV, WANDB_PPL, NOTE}),
             {PPL: Shown("PPL per M params", lambda r, t: "" if (v := ppl_per_mparam(r)) is None else f"{v:.3f}")},
             value=ppl_per_mparam)


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(columns, "COLUMNS", [*columns.COLUMNS, NEW])
    return rd.build_table(rd.load_report_data(SWEEP, export_dir=EXPORT))


def _ppl_section(md: str) -> list[str]:
    section = md.split("\n## Dev perplexity\n", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("|")]


def test_a_column_added_in_one_place_is_in_the_markdown_csv_wandb_table_and_dashboard_note(table, tmp_path):
    base = next(r for r in table.rows if r.variant == "base")
    value = ppl_per_mparam(base)
    assert value and NEW.key not in {f.name for f in dataclasses.fields(Row)}  # no field: computed

    # table3.md: the PPL table's last column, its header and the base's cell
    lines = _ppl_section(rd.table_markdown(table))
    assert lines[0].endswith("| PPL per M params |") and lines[1].endswith("|--:|")
    assert lines[2].startswith("| base |") and lines[2].endswith(f"| {value:.3f} |")
    assert all(ln.count("|") == lines[0].count("|") for ln in lines)

    # table3.csv: a column of its own, every row's value to 6 significant digits
    rows = list(csv.DictReader(io.StringIO(table_csv(table))))
    assert list(rows[0])[-1] == NEW.key and rows[0]["variant"] == "base" and rows[0][NEW.key] == f"{value:.6g}"
    assert [r[NEW.key] for r in rows] == ["" if (v := ppl_per_mparam(r)) is None else f"{v:.6g}" for r in table.rows]

    # the report's W&B run, offline: its table3/dev_ppl table has the column, read back from the run's files
    out, results = tmp_path / "build", tmp_path / "results"
    write_table(table, out)
    (out / "table3.html").write_text("<html></html>")
    target = {"mode": "offline", "project": "lightning_tfm", "entity": None}
    info = wandb_run.log_wandb_report(load_sweep(SWEEP), out, results, table, target)
    assert info is not None and info["mode"] == "offline"
    (run,) = read_runs(results / wandb_run.WANDB_DIR)
    (logged,) = run.tables["table3/dev_ppl"]
    assert logged["columns"][-1] == NEW.key and "ppl_per_mparam" not in run.tables["table3/dev_bleu"][0]["columns"]
    cells = dict(zip(logged["columns"], logged["data"][0]))
    assert cells["variant"] == "base" and cells[NEW.key] == pytest.approx(value, rel=1e-5)
    # every column of the note's dev-PPL table is one of it: the verdict and the settle budget of each row
    assert {c.key for c in columns.columns(NOTE)} <= set(logged["columns"])
    each = [dict(zip(logged["columns"], cells)) for cells in logged["data"]]
    assert [(c["variant"], c["ppl_verdict"], c["ppl_settle"]) for c in each] == [
        (r.variant, r.ppl_verdict, r.ppl_settle) for r in table.rows]
    assert all((c["ppl_settle"] is None) == (c["ppl_verdict"] != "may flip") for c in each)  # rows that may flip

    # the study's optuna-dashboard note: written and read back through optuna-dashboard (the dev extra has it)
    import optuna
    import optuna_dashboard as od

    study = optuna.create_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    od.save_note(study, optuna_note.merge_note("", optuna_note.note_text(table, str(out / "table3.html"))))
    note = _ppl_section(od.get_note(optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")))
    assert note[0].endswith("| PPL per M params |") and note[2].endswith(f"| {value:.3f} |")


def test_without_the_entry_no_view_has_it():
    table = rd.build_table(rd.load_report_data(SWEEP, export_dir=EXPORT))
    md, text = rd.table_markdown(table), table_csv(table)
    assert "PPL per M params" not in md and NEW.key not in text
    assert all(NEW.key not in cols for cols, _ in kinds.wandb_tables(table).values())
    assert "PPL per M params" not in optuna_note.note_text(table)


def test_every_column_is_declared_whole():
    """Each column: a unique key, its meaning, a value (a field of the row or its own), a markdown view only with
    its header and cell; the note's columns show in the PPL table."""
    keys = [c.key for c in columns.COLUMNS]
    assert len(keys) == len(set(keys))
    fields = {f.name for f in dataclasses.fields(Row)}
    for c in columns.COLUMNS:
        assert c.help and (c.value is not None or c.key in fields), c.key
        assert set(c.shown) <= {columns.PPL, columns.BLEU, columns.CONFIG, columns.COMPARE}, c.key
        assert NOTE not in c.views or PPL in c.shown, c.key
    # the committed reports' column order: the CSV's, the markdown tables' headers
    assert keys[:3] == ["variant", "family", "in_paper"] and keys[-1] == "status"
    assert [s.title for s in columns.shown(PPL)] == ["row", "dev PPL ours", "dev PPL paper", "ΔPPL ours",
                                                     "ΔPPL ours at base FLOPs", "ΔPPL paper", "PPL agrees",
                                                     "PPL beyond noise", "budget verdict", "settles at", "answer"]


def test_a_knob_newer_than_a_run_reads_at_its_default_and_another_architectures_not():
    """model.activation came after the committed references' runs: their saved model section lacks it, and they
    trained with its default (relu), which the report shows; an RNN row's model section (model.arch alone) has no
    Transformer knob to show, and a frozen key the config lacks stays empty."""
    from lightning_tfm.report.table3.table import knob_value

    old_run = {"model.layers": 3, "model.d_model": 128, "train.max_steps": 600}
    assert knob_value(old_run, "model.activation") == "relu"
    assert knob_value({**old_run, "model.activation": "gelu"}, "model.activation") == "gelu"
    assert knob_value({"model.arch": "rnn", "rnn.hidden": 64}, "model.activation") is None
    assert knob_value({"train.max_steps": 600}, "model.activation") is None  # no model section saved
    assert knob_value({"model.d_model": 128}, "model.layers") is None  # a frozen key: what the run saved, or empty
