"""What a report reads, checked and read as it is meant: rows whose run folders another sweep trained on are read at
their own sweep's budget; an export is refused field by field in one line before any notebook starts; a run whose
dev perplexity is no number is diverged, never a result; a side with no number never "transfers". No training:
synthetic run folders and the committed reference exports."""
from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
from pathlib import Path

import optuna
import pytest

from lightning_tfm import report as rd
from lightning_tfm.base.errors import UserError
from lightning_tfm.findings import noise
from lightning_tfm.report.inputs import export, records
from lightning_tfm.report.table3 import compare, stats
from lightning_tfm.report.table3.columns import Row
from lightning_tfm.sweep import load_sweep

from conftest import ROOT, ltfm, write_sweep
from test_verdict import BASE, CFG, _records, curve

REF = ROOT / "reports" / "reference"
CPU = REF / "table3-cpu-2026-11-25" / "export" / "table3-cpu.json"
CONTINUED = REF / "table3-cpu-continued" / "export" / "table3-cpu-continued.json"


def _one_line(p) -> str:
    assert p.returncode == 2 and p.stderr.startswith("ltfm: error: ") and p.stderr.strip().count("\n") == 0, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    return p.stderr


# ------------------------------------------------------------------------------------------------------------
# Rows continued by another sweep (defect: continued rows change the table they came from)
# ------------------------------------------------------------------------------------------------------------
def _run_folder(results: Path, name: str, variant: str, seed: int, study: str, curve_: dict[int, float], bleu: float,
                attempts: list[dict] | None = None) -> Path:
    """A run folder as ``ltfm train`` leaves it: summary.json (its latest attempt; ``attempts``: the earlier ones)
    and the metric history (a validation at each step of ``curve_``)."""
    d = results / name
    (d / "logs" / "version_0").mkdir(parents=True)
    last = max(curve_)
    steps = last + 1
    cfg = {"run": {"variant": variant, "seed": seed, "family": variant[0], "study": study},
           "train": {"max_steps": steps, "batch_tokens": 500}, "data": {"tgt_lang": "de", "vocab_size": 1000},
           "model": {k.split(".")[1]: v for k, v in CFG.items() if k.startswith("model.")}}
    summary = {"run_id": name, "status": "completed", "config": cfg, "params": 1000, "steps": steps,
               "dev_ppl": curve_[last], "dev_loss": math.log(curve_[last]), "dev_bleu": bleu,
               "effective_batch_tokens": 500, "wall_time_s": 2.0 * steps, "started_at": "2026-01-01T00:00:00"}
    if attempts:
        summary["attempts"] = attempts
    (d / "summary.json").write_text(json.dumps(summary))
    lines = ["step,dev/loss,dev/ppl"] + [f"{s},{math.log(p)},{p}" for s, p in sorted(curve_.items())]
    (d / "logs" / "version_0" / "metrics.csv").write_text("\n".join(lines) + "\n")
    return d


def _attempt(curve_: dict[int, float], steps: int, bleu: float) -> dict:
    p = curve_[steps - 1]
    return {"status": "completed", "steps": steps, "dev_ppl": p, "dev_loss": math.log(p), "dev_bleu": bleu,
            "bleu_signature": "sig-at-20", "wall_time_s": 40.0}


def test_rows_another_sweep_trained_on_are_read_at_their_own_sweeps_budget(tmp_path):
    """sweeps/table3-cpu-continued.yaml's way: a second sweep trains some rows of the first on (20 -> 40 steps here)
    in the same run folders. The first sweep's report reads each of its rows at its own budget, 20 steps: from the
    run's completed attempt at 20 steps (summary.json keeps it), else from its curve (no BLEU then), else it says the
    row cannot be read there; never a row at 40 steps beside rows at 20."""
    sweep_file = write_sweep(tmp_path / "orig.yaml", "orig",
                             {"base": {"seeds": [1, 2]}, "A1": {}, "A2": {}, "A3": {}, "A4": {}})
    results = tmp_path / "results"
    base = {s: 1000.0 / (s + 1) for s in range(4, 40, 5)}            # validations at steps 4, 9, ..., 39
    early = {s: p for s, p in base.items() if s < 20}
    worse_then_better = {s: (1.5 if s < 20 else 0.5) * p for s, p in base.items()}
    sparse = {s: 1.2 * base[s] for s in (14, 29, 34, 39)}            # no validation at the budget (step 19)
    # (variant, seed): (curve, its last BLEU, earlier attempts); trained on to 40 unless its curve ends at 19
    folders = {
        ("base", 1): (base, 30.0, [_attempt(base, 20, 10.0)]),
        ("base", 2): ({s: p + 2 for s, p in early.items()}, 11.0, None),   # not continued
        ("A1", 1): (worse_then_better, 40.0, [_attempt(worse_then_better, 20, 5.0)]),
        ("A2", 1): ({s: 1.1 * p for s, p in base.items()}, 31.0, None),     # summary without its earlier attempt
        ("A3", 1): (sparse, 32.0, None),
        ("A4", 1): ({s: 0.9 * p for s, p in early.items()}, 12.0, None),   # not continued
    }
    storage = f"sqlite:///{tmp_path / 'orig.db'}"
    study = optuna.create_study(study_name="orig", storage=storage, direction="minimize")
    for i, ((variant, seed), (curve_, bleu, attempts)) in enumerate(folders.items()):
        name = f"run-{variant}-{seed}"
        later = "cont" if max(curve_) > 19 else "orig"  # the study that trained the folder last
        d = _run_folder(results, name, variant, seed, later, curve_, bleu, attempts)
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, value=1.0,
            user_attrs={"variant": variant, "family": variant[0], "seed": seed, "max_steps": 20, "run_id": name,
                        "run_dir": str(d)}))

    data = rd.load_report_data(sweep_file, results_dir=results, storage=storage)
    table = rd.build_table(data)
    rows = {r["variant"]: r for r in table.rows}
    at20 = {v: c[19] for (v, _), (c, _, _) in folders.items() if 19 in c}
    assert rows["base"]["dev_ppl"] == pytest.approx((base[19] + base[19] + 2) / 2)   # both seeds at 20 steps
    assert rows["A1"]["dev_ppl"] == pytest.approx(at20["A1"]) and rows["A1"]["delta_ppl"] > 0   # worse at 20 steps
    assert rows["A1"]["dev_bleu"] == 5.0 and rows["base"]["dev_bleu"] == pytest.approx(10.5)  # BLEU of the attempts
    assert rows["A2"]["dev_ppl"] == pytest.approx(at20["A2"]) and rows["A2"]["dev_bleu"] is None  # from its curve
    assert rows["A3"]["dev_ppl"] is None and rows["A3"]["status"] == (
        "continued: its run folder was trained on (completed at step 40) and holds no validation at step 20, this "
        "sweep's budget")
    assert rows["A4"]["dev_ppl"] == pytest.approx(at20["A4"]) and rows["A4"]["dev_bleu"] == 12.0
    assert {v: r["train.max_steps"] for v, r in rows.items()} == {v: 20 for v in rows}
    assert {v: max(c) for v, c in table.curves.rows.items()} == {"base": 19, "A1": 19, "A2": 19, "A4": 19}
    by = {(r.variant, r.seed): r for r in data.records}
    assert by[("base", 1)].later_attempt == "completed at step 40" and by[("base", 1)].hyps is None
    assert by[("base", 2)].later_attempt is None and by[("base", 1)].wall_time_s == 40.0
    note = next(n for n in data.notes if "read at this sweep's budget" in n)
    assert "A1 s1 at 20 (folder: completed at step 40)" in note and "dev BLEU unknown at it for 1" in note
    # the export carries the records as read: rebuilt from it, the same table
    rd.write_export(data, table, tmp_path / "export")
    again = rd.build_table(rd.read_export(load_sweep(sweep_file), tmp_path / "export"))
    assert [(r["variant"], r["dev_ppl"], r["status"]) for r in again.rows] == \
        [(r["variant"], r["dev_ppl"], r["status"]) for r in table.rows]


def test_an_export_mixing_two_budgets_is_read_at_the_sweeps_budget(tmp_path):
    """The committed CPU reference, as a report of table3-cpu would have exported it after
    sweeps/table3-cpu-continued.yaml trained its rows on to 1,800 steps (their records at 1,800 steps, last trained by
    that study): rebuilt, every row is read at table3-cpu's own budget from the curves, and the dev perplexity table
    is the committed 600-step one."""
    sweep = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    committed = rd.build_table(rd.read_export(sweep, CPU), bootstrap=False)
    tree = json.loads(CPU.read_text())
    later = {(r["variant"], r["seed"]): r for r in json.loads(CONTINUED.read_text())["records"]}
    tree["records"] = [later.get((r["variant"], r["seed"]), r) for r in tree["records"]]
    (tmp_path / "table3-cpu.json").write_text(json.dumps(tree))
    data = rd.read_export(sweep, tmp_path)
    mixed = rd.build_table(data, bootstrap=False)
    keys = ("dev_ppl", "delta_ppl", "ppl_noise", "ppl_verdict", "ppl_agrees", "train.max_steps", "status")
    assert [[r[k] for k in keys] for r in mixed.rows] == [[r[k] for k in keys] for r in committed.rows]
    c1 = next(r for r in mixed.rows if r["variant"] == "C1")
    assert c1["dev_bleu"] is None and c1["train.max_steps"] == 600   # BLEU was measured at 1,800 steps only
    assert any("11 run(s) read at this sweep's budget" in n and "dev BLEU unknown at it for 11" in n
               for n in data.notes)
    # records that do not say which study trained them last cannot be read back: the table says they are of
    # another budget than the sweep plans, rather than mixing them silently
    for r in tree["records"]:
        r["config"]["run.study"] = "table3-cpu"
    (tmp_path / "table3-cpu.json").write_text(json.dumps(tree))
    unread = rd.build_table(rd.read_export(sweep, tmp_path), bootstrap=False)
    assert any(n.startswith("trained to another budget than the sweep plans beside its base: base (1800 steps, "
                            "planned 600); C1 (1800 steps, planned 600); C2") for n in unread.notes), unread.notes
    assert not any("another budget" in n for n in committed.notes + mixed.notes)


# ------------------------------------------------------------------------------------------------------------
# Exports are checked (defect: exports are trusted)
# ------------------------------------------------------------------------------------------------------------
def _set(tree: dict, path: tuple, value) -> None:
    """Change the export tree at ``path`` (keys and list indexes); ``("+records", 2)``: append a copy of record 2."""
    if path[0] == "+records":
        tree["records"].append(copy.deepcopy(tree["records"][path[1]]))
        return
    node = tree
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


# (change, words the one-line error holds): record 1 is base seed 1
BAD = [
    (("records", 1, "dev_ppl"), math.nan, "record 1 (base seed 1): dev_ppl is nan, not a finite number >= 1"),
    (("records", 1, "dev_ppl"), math.inf, "record 1 (base seed 1): dev_ppl is inf"),
    (("records", 1, "dev_ppl"), -5, "dev_ppl is -5, not a finite number >= 1"),
    (("records", 1, "dev_ppl"), True, "dev_ppl is True, not a finite number"),
    (("records", 1, "dev_ppl"), "34.5", "dev_ppl is '34.5', not a finite number"),
    (("records", 1, "dev_loss"), -math.inf, "dev_loss is -inf"),
    (("records", 1, "dev_bleu"), 101, "dev_bleu is 101, not a finite number from 0 to 100"),
    (("records", 1, "params"), 10 ** 300, "params is a 301-digit number, not an integer"),
    (("records", 1, "steps"), 600.5, "steps is 600.5, not an integer"),
    (("records", 1, "seed"), "1", "seed is '1', not an integer"),
    (("records", 1, "status"), ["completed"], "status is a JSON list, not a status"),
    (("records", 1, "history", 3, "step"), "four", "history[3].step is 'four', not an integer"),
    (("records", 1, "history", 3, "step"), 99, "history[3].step is 99, a step given twice"),
    (("records", 1, "history", 1, "dev/ppl"), math.nan, "history[1].dev/ppl is nan"),
    (("records", 1, "history", 1, "oops"), 1.0, "history[1] key is 'oops', not one of step, dev/loss"),
    (("records", 1, "history"), {"step": 1}, "history is a JSON object, not a list"),
    (("+records", 2), None, "record 23 (base seed 2) repeats record 2 (the same variant and seed)"),
    (("records", 1, "variant"), "", "record 1: variant is '', not a row name"),
    (("records", 1, "variant"), "A1\n<b>", "variant is 'A1\\n<b>', not one line of text"),
    (("records", 1, "run"), "../../etc", "run is '../../etc', not a run folder's name"),
    (("records", 1, "hyps"), "/etc/passwd", "hyps is '/etc/passwd', not null (an export holds no path)"),
    (("records", 1, "family"), "A\nB", "family is 'A\\nB', not one line of text"),
    (("records", 1, "host"), "vm\x1b]0;owned\x07", "host is 'vm\\x1b]0;owned\\x07', not one line of text"),
    (("records", 1, "config", "model.layers"), "four",
     "config[model.layers] is 'four', not of the type the config takes"),
    (("records", 1, "config", "train.lr_scale"), math.nan, "config[train.lr_scale] is nan"),
    (("records", 1, "config", "wandb.tags"), [["deep"]],
     "config[wandb.tags] is a JSON list, not a value or a list of values"),
    (("records", 1, "config"), [], "config is a JSON list, not an object of section.name keys"),
    (("records", 1, "src_len"), 0, "src_len is 0"),
    (("records", 1, "effective_batch_tokens"), 0, "effective_batch_tokens is 0"),
    (("records", 1, "vocab_size"), 8000.0, "vocab_size is 8000.0, not an integer"),
    (("records", 1), "base", "record 1 is 'base', not an object"),
    (("records",), {}, "records is a JSON object, not a list of records"),
    (("planned", "A1", "model.heads"), math.inf, "planned.A1[model.heads] is inf"),
    (("planned",), [], "planned is a JSON list"),
    (("bootstrap", "tests", "A1", "p_value"), 2, "bootstrap.tests.A1.p_value is 2, not a finite number from 0 to 1"),
    (("bootstrap", "tests", "A1", "tested"), "yes", "bootstrap.tests.A1.tested is 'yes', not true or false"),
    (("bootstrap", "tests", "A1", "seeds"), "1", "bootstrap.tests.A1.seeds is '1', not a list"),
    (("bootstrap", "notes"), "x", "bootstrap.notes is 'x', not a list"),
    (("run_info", "runs"), -1, "run_info.runs is -1"),
    (("run_info", "machines"), [7], "run_info.machines is 7, not a text"),
    (("source",), "\ud800", "source is '\\ud800', not valid Unicode"),
    (("notes",), ["a\u0085b"], "notes is 'a\\x85b', not one line of text"),
]


@pytest.mark.parametrize("path,value,words", BAD, ids=[".".join(map(str, p)) for p, _, _ in BAD])
def test_every_field_of_an_export_is_checked(tmp_path, path, value, words):
    tree = json.loads(CPU.read_text())
    _set(tree, path, value)
    f = tmp_path / "table3-cpu.json"
    f.write_text(json.dumps(tree))
    with pytest.raises(UserError) as e:
        rd.read_export(load_sweep(ROOT / "sweeps" / "table3-cpu.yaml"), f)
    msg = str(e.value)
    assert msg.startswith(f"--from-export {str(f)!r}: ") and words in msg, msg
    assert msg.endswith("fix or remove it in the file, or write the export again with `ltfm report table3-cpu.yaml` "
                        "from the runs") and "\n" not in msg


def test_an_export_too_deep_too_large_or_not_utf8_is_refused(tmp_path):
    sweep = load_sweep(ROOT / "sweeps" / "table3-cpu.yaml")
    f = tmp_path / "table3-cpu.json"
    for text, words in (("[" * 100_000 + "]" * 100_000, "not a readable JSON file (RecursionError)"),
                        ('{"format": "ltfm-report-export", "version": 1, "sweep": "table3-cpu", "x": 1' + "0" * 5000
                         + "}", "not a readable JSON file (ValueError)")):
        f.write_text(text)
        with pytest.raises(UserError, match=r"\(\w+Error\)") as e:
            rd.read_export(sweep, f)
        assert words in str(e.value)
    f.write_bytes(CPU.read_bytes().replace(b'"vm"', b'"v\xe9"'))
    with pytest.raises(UserError, match=r"not a readable JSON file \(UnicodeDecodeError\)"):
        rd.read_export(sweep, f)
    with f.open("wb") as out:  # a sparse file beyond the size any export has
        out.truncate(export.MAX_BYTES + 1)
    with pytest.raises(UserError, match="is larger than 256 MiB"):
        rd.read_export(sweep, f)


def test_a_bad_export_stops_the_command_before_any_notebook(tmp_path, ltfm_here):
    """Through the command line: one line naming the file, the record and the field, exit 2, nothing executed or
    written. The first in a real process, the others in this one (``cli.main``: the same lines, no seconds of
    imports each)."""
    for i, (path, value, words) in enumerate([BAD[0], BAD[4], BAD[10], BAD[11], BAD[16]]):
        run = ltfm if i == 0 else ltfm_here
        tree = json.loads(CPU.read_text())
        _set(tree, path, value)
        (tmp_path / f"e{i}").mkdir()
        (tmp_path / f"e{i}" / "table3-cpu.json").write_text(json.dumps(tree))
        out = tmp_path / f"out{i}"
        p = run("report", "sweeps/table3-cpu.yaml", "--from-export", tmp_path / f"e{i}", "--out", out)
        err = _one_line(p)
        assert words in err and str(tmp_path / f"e{i}" / "table3-cpu.json") in err
        assert "executing" not in p.stdout and not out.exists() and list(tmp_path.glob(".out*")) == []


def test_against_export_errors_name_against_export(tmp_path, ltfm_here):
    """Side B's export is refused naming the option that gave it (--against-export), never --from-export."""
    s = ROOT / "sweeps" / "table3-cpu.yaml"
    with pytest.raises(UserError,
                       match=r"^--against-export '.*' exports sweep 'table3-cpu-continued', not 'table3-cpu'"):
        rd.read_export(load_sweep(s), CONTINUED, option="--against-export")
    p = ltfm_here("report", "sweeps/table3-cpu-continued.yaml", "--from-export", CONTINUED, "--against", s,
             "--against-export", CONTINUED, "--out", tmp_path / "cmp")
    err = _one_line(p)
    assert "--against-export" in err and "--from-export" not in err and "exports sweep 'table3-cpu-continued'" in err
    p = ltfm_here("report", "sweeps/table3-cpu-continued.yaml", "--from-export", CONTINUED, "--against", s,
             "--against-export", tmp_path / "nowhere", "--out", tmp_path / "cmp")
    err = _one_line(p)
    assert err.startswith("ltfm: error: --against-export ") and "no export of sweep 'table3-cpu'" in err
    # side B from a results folder: its options, likewise
    with pytest.raises(UserError, match=r"\(--against-results, the sweep's run.results_dir\)"):
        records.resolve_local(load_sweep(s), tmp_path / "nowhere", None, ("--against-results", "--against-storage"))
    p = ltfm_here("report", "sweeps/table3-cpu-continued.yaml", "--from-export", CONTINUED, "--against", s,
             "--against-results", tmp_path / "nowhere", "--out", tmp_path / "cmp")
    err = _one_line(p)
    assert "(--against-results, the sweep's run.results_dir)" in err and not list(tmp_path.glob("*cmp*"))


# ------------------------------------------------------------------------------------------------------------
# A dev perplexity that is no number: diverged, never a result
# ------------------------------------------------------------------------------------------------------------
def test_a_run_whose_dev_ppl_is_no_number_is_diverged_and_never_a_seed_of_the_noise(tmp_path):
    """In the results folder (no storage): a base seed and a row ended with dev PPL nan / inf (json writes NaN and
    Infinity): both are diverged runs, the base's noise is its other seeds' spread, the row has no change."""
    sweep_file = write_sweep(tmp_path / "div.yaml", "div", {"base": {"seeds": [1, 2, 3]}, "A1": {}, "A2": {}})
    results = tmp_path / "results"
    good = {s: 1000.0 / (s + 1) for s in range(4, 20, 5)}
    for seed, shift in ((1, 0.0), (2, 1.0)):
        _run_folder(results, f"base-{seed}", "base", seed, "div", {s: p + shift for s, p in good.items()}, 10.0)
    _run_folder(results, "A2", "A2", 1, "div", {s: 1.2 * p for s, p in good.items()}, 10.0)
    for name, variant, seed, bad in (("base-3", "base", 3, math.nan), ("A1", "A1", 1, math.inf)):
        d = _run_folder(results, name, variant, seed, "div", good, 10.0)
        summary = json.loads((d / "summary.json").read_text())
        summary.update(dev_ppl=bad, dev_loss=bad)
        (d / "summary.json").write_text(json.dumps(summary))
    data = rd.load_report_data(sweep_file, results_dir=results)
    table = rd.build_table(data, bootstrap=False)
    rows = {r["variant"]: r for r in table.rows}
    assert rows["base"]["status"] == "2/3 seeds completed; seed 3 diverged: dev PPL nan at the end"
    assert rows["base"]["dev_ppl_std"] == pytest.approx(math.sqrt(0.5))   # seeds 1 and 2 only
    assert rows["A1"]["status"] == "diverged: dev PPL inf at the end"
    assert rows["A1"]["delta_ppl"] is None and rows["A1"]["ppl_noise"] is None and rows["A1"]["ppl_verdict"] is None
    assert rows["A2"]["ppl_noise"] == "beyond"    # not "within noise" for want of a base spread
    # a W&B run's summary gives them as strings
    rec = rd.wandb_record({"run.variant": "A1"}, {"status": "completed", "dev_ppl": "NaN", "dev_loss": "NaN"})
    assert (rec.status, rec.note, rec.dev_ppl) == ("diverged", "dev PPL nan at the end", None)
    # records built otherwise (the API), with the number in them: the table counts them as diverged too
    records = _records({"A1": curve(lambda s: 1.2 * BASE[s])})
    records[0].dev_ppl = math.nan
    records[-1].dev_ppl = math.inf
    sweep = load_sweep(write_sweep(tmp_path / "api.yaml", "api", {"base": {"seeds": [1, 2, 3]}, "A1": {}}))
    api = {r["variant"]: r for r in rd.build_table(rd.ReportData(sweep, records, "api", {}), bootstrap=False).rows}
    assert api["base"]["seeds_completed"] == 2 and math.isfinite(api["base"]["dev_ppl_std"])
    assert api["A1"]["delta_ppl"] is None and api["A1"]["status"] == "diverged: dev PPL inf at the end"


# ------------------------------------------------------------------------------------------------------------
# A side with no number never transfers (defect: with --against, a NaN side yielded "transfers")
# ------------------------------------------------------------------------------------------------------------
def test_a_side_whose_change_is_no_number_is_not_compared(tmp_path):
    nan_row = Row("A1", delta_ppl=math.nan, ppl_verdict="within noise")
    ok_row = Row("A1", delta_ppl=0.01, ppl_verdict="within noise")
    assert compare.status(nan_row, ok_row) == compare.ONLY_B and compare.status(ok_row, nan_row) == compare.ONLY_A
    assert compare.status(nan_row, dataclasses.replace(nan_row, delta_ppl=math.inf)) == compare.UNSETTLED
    assert noise.noise_verdict(math.nan, 0.1) is None and noise.noise_verdict(0.5, math.nan) == "unknown"
    assert stats.agrees(math.nan, 0.3) is None and stats.agrees(math.inf, 0.3) is None
    assert noise.relative(math.nan, 5.0) is None
    # whole tables: side A's A1 ended with dev PPL nan (a record built without the readers' checks)
    sweep = load_sweep(write_sweep(tmp_path / "syn.yaml", "syn", {"base": {"seeds": [1, 2, 3]}, "A1": {}}))
    same = {"A1": curve(lambda s: BASE[s] + 0.01)}
    a_records = _records(same)
    a_records[-1].dev_ppl = math.nan
    a, b = (rd.build_table(rd.ReportData(sweep, recs, "s", {}), bootstrap=False)
            for recs in (a_records, _records(same)))
    row = rd.compare_tables(a, b).rows[0]
    assert row.status == compare.ONLY_B and row.a.delta_ppl is None


def test_the_committed_exports_pass_the_checks_unchanged():
    """What a report writes is what the checks take (the committed reference rebuilds: tests/test_compare.py)."""
    for sweep, f in (("table3-cpu.yaml", CPU), ("table3-cpu-continued.yaml", CONTINUED)):
        data = rd.read_export(load_sweep(ROOT / "sweeps" / sweep), f)
        assert data.notes == [] and len({(r.variant, r.seed) for r in data.records}) == len(data.records)
        assert all(r.later_attempt is None for r in data.records)
    rows = list(csv.DictReader((REF / "table3-cpu-2026-11-25" / "table3.csv").open()))
    assert {r["train_steps"] for r in rows} == {"600", "1800"}   # big trains three times the steps, as planned
