"""The Table 2 report (lightning_tfm/report/table2/table.py) from synthetic records (no training): a sweep of a
transformer row and recurrent rows, the rows' numbers, the claim's two lines (BLEU at equal training FLOPs; the
FLOPs and wall time to reach the RNN's final dev BLEU or PPL), missing rows, the paper's rows; the FLOPs of an
rnn record (report/table3/compute.py) are the RNN class's own count; the notebook chosen for a Table 2 sweep."""
from __future__ import annotations

import csv
import io
import json
import math

import pytest
import yaml

from lightning_tfm.model.rnn import RNN, RNNConfig
from lightning_tfm.report.inputs.records import ReportData, RunRecord
from lightning_tfm.report.table2 import table as table2
from lightning_tfm.report.table2.claims import reach
from lightning_tfm.report.table3 import compute, paper

from conftest import write_sweep

TRANSFORMER = {"model.layers": 1, "model.d_model": 32, "model.d_ff": 64, "model.heads": 2, "model.d_k": 16,
               "model.d_v": 16}
RNN_KNOBS = {"rnn.emb_size": 32, "rnn.enc_hidden": 32, "rnn.dec_hidden": 64, "rnn.attention_size": 32}
STEPS = range(100, 700, 100)  # validations at 100 .. 600
LENGTHS = {"vocab_size": 500, "src_len": 12.0, "tgt_len": 14.0}


@pytest.fixture
def sweep(tmp_path):
    """transformer, rnn (trained below) and rnn-big (never run), at two seeds, on an experiment without model knobs."""
    from lightning_tfm.sweep import load_sweep

    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"run": {"name": "t2"}, "data": {"source": "local"}}))
    (tmp_path / "t2.yaml").write_text(yaml.safe_dump({
        "name": "t2syn", "experiment": "exp.yaml", "metric": "dev_loss", "pruner": {"type": "none"}, "seeds": [1, 2],
        "variants": {"transformer": TRANSFORMER, "rnn": {"model.arch": "rnn", **RNN_KNOBS},
                     "rnn-big": {"model.arch": "rnn", **RNN_KNOBS, "rnn.dec_hidden": 128}}}, sort_keys=False))
    return load_sweep(tmp_path / "t2.yaml")


def record(tmp_path, variant, seed, config, ppl, bleu=None, test_bleu=None, wall=60.0, tokens=1000.0):
    """A completed run of 600 steps: its dev PPL (and dev BLEU) curve ``ppl(step)``, a summary.json with test BLEU
    and ``wall`` seconds of training (the run's wall time: 30 s more, its closing decoding)."""
    run = tmp_path / f"{variant}-s{seed}"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"status": "completed", "test_bleu": test_bleu,
                                                  "tokens_per_s": 12345.0, "train_time_s": wall}))
    history = [{"step": s, "dev/ppl": ppl(s), **({"dev/bleu": bleu(s)} if bleu else {})} for s in STEPS]
    return RunRecord(variant, seed=seed, status="completed", config=dict(config), steps=600, history=history,
                     dev_ppl=ppl(600), dev_bleu=bleu(600) if bleu else 20.0, wall_time_s=wall + 30, params=10_000,
                     effective_batch_tokens=tokens, train_tokens=600 * tokens, run=str(run), **LENGTHS)


def rnn_tokens_for_equal_flops() -> float:
    """Target tokens a step that make an rnn step cost a transformer step of 1,000 tokens."""
    per_step = compute.step_flops(RunRecord("t", config=TRANSFORMER, effective_batch_tokens=1000, **LENGTHS))[0]
    per_token = compute.step_flops(RunRecord("r", config={"model.arch": "rnn", **RNN_KNOBS},
                                             effective_batch_tokens=1, **LENGTHS))[0]
    return per_step / per_token


def records(tmp_path, bleu_curves=False, rnn_tokens=None):
    rnn_tokens = rnn_tokens or rnn_tokens_for_equal_flops()
    rnn_cfg = {"model.arch": "rnn", **RNN_KNOBS}
    t_bleu, r_bleu = ((lambda s: s / 20), (lambda s: s / 40)) if bleu_curves else (None, None)
    return [record(tmp_path, "transformer", 1, TRANSFORMER, lambda s: 3600 / s, t_bleu, 30.0),
            record(tmp_path, "transformer", 2, TRANSFORMER, lambda s: 3600 / s, t_bleu, 31.0),
            record(tmp_path, "rnn", 1, rnn_cfg, lambda s: 6000 / s, r_bleu, 25.0, wall=120.0, tokens=rnn_tokens),
            record(tmp_path, "rnn", 2, rnn_cfg, lambda s: 6000 / s, r_bleu, 26.0, wall=120.0, tokens=rnn_tokens)]


def test_rnn_flops_per_step_are_the_rnn_classs_own_count():
    rec = RunRecord("rnn", status="completed", config={"model.arch": "rnn", **RNN_KNOBS, "rnn.cell": "lstm"},
                    effective_batch_tokens=800, **LENGTHS)
    cfg = RNNConfig(emb_size=32, enc_hidden=32, dec_hidden=64, attention_size=32, cell="lstm")
    own = RNN.train_flops_per_token(cfg, 500, 12.0, 14.0) * 800
    assert compute.step_flops(rec) == (pytest.approx(own), True)
    assert compute.flops_per_step([rec, rec]) == (pytest.approx(own), True)
    # a GRU costs 3/4 of an LSTM's gates: the section's knobs are read, not its defaults
    gru = RunRecord("rnn", status="completed", config={"model.arch": "rnn", **RNN_KNOBS}, effective_batch_tokens=800,
                    **LENGTHS)
    assert compute.step_flops(gru)[0] < own
    # an architecture not registered here, or no tokens: no count
    assert compute.step_flops(RunRecord("x", config={"model.arch": "nope"}, effective_batch_tokens=8)) == (None, False)
    assert compute.step_flops(RunRecord("x", config={"model.arch": "rnn"})) == (None, False)


def test_a_runs_tokens_a_step_count_its_accumulation_as_the_sweep_plans_them():
    """A record without the budget its run recorded (an export of an older run, a W&B run) is counted from its
    config as the sweep plans it (training.config.sections.tokens_per_step): train.accumulate multiplies the
    tokens a step; batch_tokens_total stands for itself."""
    from lightning_tfm.training.config.sections import tokens_per_step

    cfg = {"model.arch": "rnn", **RNN_KNOBS, "train.batch_tokens": 400, "train.devices": "1"}
    once = compute.step_flops(RunRecord("r", config=cfg, **LENGTHS))[0]
    twice = compute.step_flops(RunRecord("r", config={**cfg, "train.accumulate": 2}, **LENGTHS))[0]
    recorded = compute.step_flops(RunRecord("r", config=cfg, effective_batch_tokens=800, **LENGTHS))[0]
    assert twice == pytest.approx(2 * once) == pytest.approx(recorded)
    total = compute.step_flops(RunRecord("r", config={**cfg, "train.batch_tokens_total": 800}, **LENGTHS))[0]
    assert total == pytest.approx(recorded)
    assert tokens_per_step(400, "0,1", 2) == 1600 and tokens_per_step(400, "auto", 1, 1000) == 1000


def test_paper_rows_are_loaded():
    rows = paper.load_paper2()
    assert rows["GNMT + RL"]["bleu_en_de"] == 24.6 and rows["GNMT + RL"]["train_flops_en_de"] == 2.3e19
    assert rows["Transformer (big)"]["bleu_en_de"] == 28.4 and rows["ByteNet"]["train_flops_en_de"] is None
    assert [p["model"] for p in table2.paper_rows()] == ["GNMT + RL", "ConvS2S", "Transformer (base model)",
                                                          "Transformer (big)"]
    claim = table2.paper_claim()
    assert "Transformer (base model) 27.3 BLEU at 3.3e+18" in claim and "GNMT + RL 24.6 at 2.3e+19 (7.0x" in claim


def test_table_and_claims_at_equal_flops_from_ppl_curves(sweep, tmp_path):
    table = table2.build_table2(ReportData(sweep, records(tmp_path), "synthetic", {}))
    by = {r["variant"]: r for r in table.rows}
    assert [r["variant"] for r in table.rows] == ["transformer", "rnn", "rnn-big"]
    t, r, big = by["transformer"], by["rnn"], by["rnn-big"]
    assert (t["arch"], r["arch"], big["arch"]) == ("transformer", "rnn", "rnn")
    assert t["test_bleu"] == pytest.approx(30.5) and t["test_bleu_std"] == pytest.approx(math.sqrt(0.5))
    assert t["dev_ppl"] == pytest.approx(6.0) and r["dev_ppl"] == pytest.approx(10.0)
    assert t["train_time_s"] == 60.0 and t["tokens_per_s"] == 12345.0 and t["params"] == 10_000
    assert t["train_flops"] == pytest.approx(600 * t["flops_per_step"])
    assert r["train_flops"] == pytest.approx(t["train_flops"], rel=1e-3)  # the same budget
    # the row never run keeps its row, without numbers
    assert big["status"].startswith("missing") and big["test_bleu"] is None and big["seeds_completed"] == 0

    assert table.metric == "ppl"
    a, b, a_big, b_big = table.claims
    assert a.startswith("(a) BLEU at equal training FLOPs: transformer 30.50 ± 0.71 against rnn 25.50 ± 0.71 "
                        "test BLEU")
    assert "the same budget within 5%" in a and "transformer higher by 5.00 BLEU, beyond seed noise (Welch's 90% " \
                                                 "t interval of the difference at 2 seeds a row, ±2.06, excludes " \
                                                 "zero)" in a
    # (b) on the PPL curves: the transformer reaches the rnn's final 10.0 between its validations at 300 (12.0) and
    # 400 (9.0), log PPL linear: step 300 + 100 x log(12/10) / log(12/9)
    step = 300 + 100 * math.log(1.2) / math.log(12 / 9)
    assert reach(t, "ppl", 10.0) == pytest.approx(step)
    assert "(b) To reach rnn's final dev PPL (10.00), on the dev-PPL curves (no dev-BLEU curve" in b
    assert f"transformer needs {step * t['flops_per_step']:.3g} FLOPs and {step * 0.1:.0f} s (step {step:.0f})" in b
    assert f"{600 / step:.2f}x fewer FLOPs and {1200 / step:.2f}x less wall time" in b
    assert "not checked, no completed run of rnn-big" in a_big and "not checked, no dev PPL curve of rnn-big" in b_big


def test_claims_from_bleu_curves_and_unequal_budgets(sweep, tmp_path):
    recs = records(tmp_path, bleu_curves=True, rnn_tokens=2 * rnn_tokens_for_equal_flops())
    table = table2.build_table2(ReportData(sweep, recs, "synthetic", {}))
    by = {r["variant"]: r for r in table.rows}
    assert table.metric == "bleu"
    a, b = table.claims[:2]
    assert "NOT at equal training FLOPs" in a and "2.00x" in a
    # the rnn's final dev BLEU 15 is the transformer's at step 300: half the steps at half the rnn's step cost
    assert "(b) To reach rnn's final dev BLEU (15.00), on the dev-BLEU curves" in b
    assert f"transformer needs {300 * by['transformer']['flops_per_step']:.3g} FLOPs and 30 s (step 300)" in b
    assert "4.00x fewer FLOPs and 4.00x less wall time" in b
    # one seed each: the noise is unknown; a sweep of one architecture has no claim
    one = table2.build_table2(ReportData(sweep, recs[::2], "synthetic", {}))
    assert "seed noise unknown" in one.claims[0]
    assert table2.claim_lines([r for r in one.rows if r["arch"] == "rnn"], "ppl")[0].startswith("The claim is not")


def test_each_pair_reads_the_bleu_curves_when_both_rows_logged_one(sweep, tmp_path):
    """A row without a dev-BLEU curve (its runs logged none) sends its own pair to the dev-PPL curves, naming it, and
    leaves the other pair on the BLEU curves; the notes say which rows have BLEU curves and how they were taken."""
    recs = records(tmp_path, bleu_curves=True)
    rnn_big = {"model.arch": "rnn", **RNN_KNOBS, "rnn.dec_hidden": 128}
    recs += [record(tmp_path, "rnn-big", seed, rnn_big, lambda s: 7000 / s, None, 20.0) for seed in (1, 2)]
    for r in recs:
        r.config.update({"decode.dev_bleu_every_steps": 0 if r.variant == "rnn-big" else 100,
                         "decode.dev_bleu_subset": 200})
    table = table2.build_table2(ReportData(sweep, recs, "synthetic", {}))
    assert table.metric == "ppl"  # not every row has a BLEU curve (the figure's second panel row still drawn)
    _, b, _, b_big = table.claims
    assert "(b) To reach rnn's final dev BLEU (15.00), on the dev-BLEU curves" in b
    assert ("(b) To reach rnn-big's final dev PPL (11.67), on the dev-PPL curves (no dev-BLEU curve of rnn-big: its "
            "runs logged dev BLEU at fewer than two validations" in b_big), b_big
    note = table2.bleu_curves_note(table.rows)
    assert note.startswith("Dev BLEU curves (claim (b), the figure): beam search BLEU along training, transformer "
                           "every 100 steps on the first 200 dev sentences; rnn every 100 steps") and \
        note.endswith("; none for rnn-big. The table's dev BLEU: the whole dev set at the end."), note
    # no row with a curve: said in one line
    for r in recs:
        r.history = [{k: v for k, v in h.items() if k != "dev/bleu"} for h in r.history]
    table = table2.build_table2(ReportData(sweep, recs, "synthetic", {}))
    assert table2.bleu_curves_note(table.rows).startswith("Dev BLEU curves: none")
    assert all("on the dev-PPL curves (no dev-BLEU curve of transformer or rnn" in line
               for line in table.claims[1::2] if "not checked" not in line)


def test_written_files_and_figure(sweep, tmp_path):
    table = table2.build_table2(ReportData(sweep, records(tmp_path, bleu_curves=True), "synthetic", {}))
    md_path, csv_path = table2.write_table2(table, tmp_path / "out")
    md = md_path.read_text()
    assert md.startswith("# Table 2 at small scale: sweep t2syn") and "## The paper's Table 2 (not comparable" in md
    assert "| transformer | transformer | 30.50 ± 0.71 |" in md and "| GNMT + RL | recurrent | 24.6 | 2.3e+19 |" in md
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert [(r["source"], r["variant"]) for r in rows][:3] == [("ours", "transformer"), ("ours", "rnn"),
                                                              ("ours", "rnn-big")]
    assert [r["variant"] for r in rows if r["source"] == "paper"] == [p["model"] for p in table2.paper_rows()]
    assert float(rows[0]["test_bleu"]) == 30.5 and rows[2]["test_bleu"] == ""
    assert table2.read_claims(md_path) == table.claims + [table.paper_claim]
    png = table2.plot_curves(table, tmp_path / "out" / "table2_curves.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_mixed_sweep_gets_the_table2_notebook(sweep, tmp_path):
    from lightning_tfm.report.publish.notebooks import notebook_name, notebook_path
    from lightning_tfm.sweep import load_sweep

    assert table2.is_table2(sweep) and notebook_name(sweep) == "table2"
    assert notebook_path("table2").is_file()
    plain = load_sweep(write_sweep(tmp_path / "s.yaml", "plain", {"base": {}, "A1": {"model.heads": 1}}))
    assert not table2.is_table2(plain) and notebook_name(plain) == "table3"


def write_smoke_runs(results):
    """Run folders of sweeps/table2-smoke.yaml's rows written into ``results`` as training leaves them, without
    training: each row's planned config, a summary.json and a metrics.csv of its validations; returns the sweep."""
    from lightning_tfm.sweep import Entry, load_sweep, trial_config

    from conftest import ROOT

    sweep = load_sweep(ROOT / "sweeps" / "table2-smoke.yaml")
    numbers = {"transformer": (3000, 12.0), "rnn": (5000, 9.0)}  # dev PPL a / step, dev BLEU 100 step / a; test BLEU
    for name, v in sweep.variants.items():
        cfg = trial_config(sweep, Entry(name, v["family"], 1, v["overrides"], v["budget"]), checked=False)
        steps, (a, bleu) = cfg.train.max_steps, numbers[name]
        run = results / f"table2-smoke-{name}-s1"
        (run / "logs" / "version_0").mkdir(parents=True)
        every, bleu_every = cfg.train.val_every_steps, cfg.decode.dev_bleu_every_steps
        validations = sorted({*range(every, steps, every), steps})  # logged at the step before (Lightning's)
        # as training logs them: dev BLEU at the validations every decode.dev_bleu_every_steps (the sweep's)
        (run / "logs" / "version_0" / "metrics.csv").write_text("dev/ppl,dev/bleu,step\n" + "".join(
            f"{a / s},{s / a * 100 if s % bleu_every == 0 else ''},{s - 1}\n" for s in validations))
        (run / "summary.json").write_text(json.dumps({
            "status": "completed", "config": cfg.to_dict(), "steps": steps, "params": 1000, "vocab_size": 1000,
            "effective_batch_tokens": cfg.train.batch_tokens, "dev_ppl": a / steps, "dev_loss": math.log(a / steps),
            "dev_bleu": bleu - 1, "test_bleu": bleu, "train_tokens": steps * cfg.train.batch_tokens,
            "wall_time_s": 20.0, "train_time_s": 15.0, "tokens_per_s": 4000.0}))
    return sweep


def test_ltfm_report_of_a_table2_sweep(tmp_path):
    """``ltfm report sweeps/table2-smoke.yaml`` on run folders written here (:func:`write_smoke_runs`): the Table 2
    notebook runs and writes its files, and the claim is printed."""
    from conftest import ltfm

    results = tmp_path / "results"
    sweep = write_smoke_runs(results)
    out = tmp_path / "report"
    p = ltfm("report", sweep.path, "--results", results, "--out", out)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "executing table2.ipynb" in p.stdout and "(a) BLEU at equal training FLOPs: transformer 12.00 against " \
                                                    "rnn 9.00 test BLEU" in p.stdout, p.stdout
    assert "unknown parameter" not in p.stdout + p.stderr
    for f in ("table2.md", "table2.csv", "table2.html", "table2.ipynb", "table2_curves.png", "table2_alignment.png"):
        assert (out / f).is_file(), f
    # these run folders have no checkpoints: the alignment cell says so in one line (tests/test_attention_figures.py
    # draws one from checkpoints)
    assert ("Cross-attention of the first dev sentences per architecture: not drawn, needs a run folder with "
            "checkpoints in the results folder: no completed run of it has one here."
            ) in (out / "table2.html").read_text()
    # the smoke sweep logs dev BLEU along training: claim (b) reads the BLEU curves, and the notes say on what
    md = (out / "table2.md").read_text()
    assert "(b) To reach rnn's final dev BLEU (0.40), on the dev-BLEU curves" in md, md
    assert "transformer every 10 steps on the first 50 dev sentences; rnn every 10 steps" in md
    assert "GNMT + RL" in (out / "table2.html").read_text()


def test_planned_configs_of_rows_of_their_own_experiment(tmp_path, data_dir):
    """The planned config of a row without a run (report/records.planned_configs) once a base run completed: a row
    of the sweep's experiment gets its overrides on the base run's config, a row of its own experiment (the rnn)
    its own experiment's config, not the base run's, with the command line's overrides the base run shows (here
    data.path and train.max_steps=40: the rnn's equal-FLOPs steps follow them, as the sweep plans them)."""
    from lightning_tfm.report.inputs.records import planned_configs
    from lightning_tfm.sweep import Plan, load_sweep, trial_config
    from lightning_tfm.training.config.config import flatten

    from conftest import ROOT, SMOKE

    rnn_smoke = ROOT / "experiments" / "multi30k-rnn-smoke.yaml"
    (tmp_path / "mixed.yaml").write_text(yaml.safe_dump({
        "name": "mixed", "experiment": str(SMOKE), "budget": {"equal": "flops", "src_len": 12.0, "tgt_len": 12.0},
        "variants": {"base": {"family": "transformer"}, "A1": {"model.heads": 2, "model.d_k": 32, "model.d_v": 32},
                     "rnn": {"family": "rnn", "experiment": str(rnn_smoke)}}}, sort_keys=False))
    sweep = load_sweep(tmp_path / "mixed.yaml")
    cli = {"data.path": str(data_dir), "train.max_steps": 40}
    entries = {e.name: e for e in sweep.entries()}
    base = RunRecord("base", seed=1, status="completed",
                     config=flatten(trial_config(sweep, entries["base"], cli, checked=False)))
    planned = planned_configs(sweep, [base])
    rnn = planned["rnn"]
    assert rnn == flatten(trial_config(sweep, entries["rnn"], cli, checked=False))
    assert rnn["model.arch"] == "rnn" and rnn["rnn.dec_hidden"] == 128 and rnn["train.lr_schedule"] == "plateau"
    assert rnn["train.lr"] == 0.002 and rnn["data.path"] == str(data_dir.resolve())  # the config resolves links
    plan = Plan(sweep, [f"{k}={v}" for k, v in cli.items()], data=False)
    assert rnn["train.max_steps"] == plan.max_steps(entries["rnn"]) != 40
    a1 = planned["A1"]  # a row of the sweep's experiment: the base run's config with its own overrides
    assert (a1["model.heads"], a1["train.max_steps"], a1["data.path"]) == (2, 40, str(data_dir.resolve()))
    assert a1.get("model.arch", "transformer") == "transformer" and a1.get("train.lr_schedule", "noam") == "noam"


def test_a_sweep_of_recurrent_rows_alone_is_reported_as_table2_not_table3(tmp_path, ltfm_here):
    """No Transformer row: not a Table 3 (whose knobs, paper rows and base are the Transformer's: its base would read
    "N 6, d_model 512, h 8" and its rows change no knob) but rows by their own architecture and cost; a Table 3
    comparison (--against) and --from-export (a Table 3 report's) are refused in one line."""
    from lightning_tfm.report.publish.notebooks import notebook_name
    from lightning_tfm.sweep import load_sweep

    from conftest import ROOT

    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"run": {"name": "r"}, "data": {"source": "local"}}))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "name": "rnnonly", "experiment": "exp.yaml", "metric": "dev_loss", "pruner": {"type": "none"}, "seeds": [1],
        "variants": {"base": {"model.arch": "rnn", **RNN_KNOBS},
                     "wide": {"model.arch": "rnn", **RNN_KNOBS, "rnn.enc_hidden": 64}}}, sort_keys=False))
    sweep = load_sweep(tmp_path / "r.yaml")
    assert table2.is_table2(sweep) and notebook_name(sweep) == "table2"
    config = {"model.arch": "rnn", **RNN_KNOBS}
    recs = [record(tmp_path, "base", 1, config, lambda s: 3000.0 / s),
            record(tmp_path, "wide", 1, {**config, "rnn.enc_hidden": 64}, lambda s: 2500.0 / s)]
    table = table2.build_table2(ReportData(sweep, recs, "synthetic", {}))
    assert [(r["variant"], r["arch"]) for r in table.rows] == [("base", "rnn"), ("wide", "rnn")]
    assert table.claims == ["The claim is not checked: the sweep has no transformer row beside a row of another "
                               "architecture."]
    md = table2.table2_markdown(table)
    assert "| wide | rnn |" in md and "Table 3" not in md and "d_model" not in md
    for args, words in ((["--against", ROOT / "sweeps" / "table3-cpu.yaml"], "sweep 'rnnonly' has rows of another "
                         "architecture, a Table 2 report: report it alone"),
                        (["--from-export", tmp_path], "not a Table 2 report (rows of another architecture than the "
                         "Transformer)")):
        p = ltfm_here("report", sweep.path, *args, "--out", tmp_path / "out")
        assert p.returncode == 2 and p.stderr.startswith("ltfm: error: ") and p.stderr.count("\n") == 1, p.stderr
        assert words in p.stderr and not (tmp_path / "out").exists(), p.stderr


def test_a_table2_column_declared_once_is_in_the_markdown_csv_wandb_table_summary_and_note(sweep, tmp_path,
                                                                                          monkeypatch):
    """One entry of report/table2_columns.COLUMNS, a value computed from the row: table2.md's table of ours and the
    study note show it, table2.csv and the report run's W&B table ``table2/rows`` have it as a column, the W&B
    summary as ``<row>/<key>`` (:mod:`.wandb_run` and :mod:`.optuna_note` dispatch by the report's Kind, no list of
    their own)."""
    from lightning_tfm.report.core.columns import CSV, Column, Shown
    from lightning_tfm.report.publish import optuna_note, wandb_run
    from lightning_tfm.report.table2 import columns as table2_columns

    def per_m(r):
        return r.test_bleu / (r.params / 1e6) if r.test_bleu is not None and r.params else None

    new = Column("bleu_per_mparam", "test BLEU per million parameters", frozenset({CSV, table2_columns.SUMMARY}),
                 {table2_columns.ROWS: Shown("BLEU per M params", lambda r, t: f"{per_m(r):.1f}" if per_m(r) else "")},
                 value=per_m)
    table = table2.build_table2(ReportData(sweep, records(tmp_path), "synthetic", {}))
    monkeypatch.setattr(table2_columns, "COLUMNS", [*table2_columns.COLUMNS, new])
    md, note = table2.rows_markdown(table), optuna_note.note_text(table, kind="table2")
    head, _, first = [ln for ln in md.splitlines() if ln.startswith("|")][:3]
    assert head.endswith("| BLEU per M params |") and first.startswith("| transformer |")
    assert first.endswith(f"| {30.5 / 0.01:.1f} |") and head in note and first in note
    rows = list(csv.DictReader(io.StringIO(table2.table2_csv(table))))
    assert list(rows[0])[-1] == "bleu_per_mparam" and float(rows[0]["bleu_per_mparam"]) == pytest.approx(3050.0)
    assert rows[2]["bleu_per_mparam"] == "" and rows[3]["source"] == "paper"  # rnn-big: no run; the paper's: no params
    summary, tables = wandb_run.report_contents(table, "table2")
    cols, data = tables["table2/rows"]
    assert cols == list(rows[0]) and data[0][-1] == pytest.approx(3050.0)
    assert summary["transformer/bleu_per_mparam"] == pytest.approx(3050.0) and "rnn-big/bleu_per_mparam" not in summary


@pytest.mark.parametrize("t_bleu, r_bleu, said, unsaid", [
    # both flat at 0.0 (a pipeline check): both reach the rnn's final 0.00 at their first validation
    (lambda s: 0.0, lambda s: 0.0, "cannot say which spends fewer FLOPs or less wall time (transformer and rnn reach "
     "it by their first validation, where its cost is only an upper bound)", "x fewer FLOPs"),
    # the transformer is at 20 from its first validation; the rnn climbs to its final 15 at step 600: the
    # transformer's cost is at most 100 steps', so it spends at least 6x fewer FLOPs (equal FLOPs a step)
    (lambda s: 20.0, lambda s: s / 40, "transformer spends at least 6.00x fewer FLOPs and at least 12.00x less wall "
     "time (transformer reaches it by its first validation", "cannot say"),
    # the other way round: the rnn is at its final 15 from the start; the transformer needs step 300
    (lambda s: s / 20, lambda s: 15.0, "transformer spends at least 3.00x more FLOPs and at least 1.50x more wall "
     "time (rnn reaches it by its first validation", "cannot say")])
def test_a_side_at_the_target_by_its_first_validation_has_an_upper_bound_not_a_ratio(sweep, tmp_path, t_bleu, r_bleu,
                                                                                     said, unsaid):
    """#52, 15: a curve that meets the target at its first validation says only that its cost is at most that
    validation's; claim (b) never divides two such bounds ("1.15x fewer FLOPs"), and says a ratio only where the
    bound still decides it."""
    rnn = {"model.arch": "rnn", **RNN_KNOBS}
    recs = [record(tmp_path, "transformer", s, TRANSFORMER, lambda x: 3600 / x, t_bleu, 30.0) for s in (1, 2)]
    recs += [record(tmp_path, "rnn", s, rnn, lambda x: 6000 / x, r_bleu, 25.0, wall=120.0,
                    tokens=rnn_tokens_for_equal_flops()) for s in (1, 2)]
    b = table2.build_table2(ReportData(sweep, recs, "synthetic", {})).claims[1]
    assert "on the dev-BLEU curves" in b and said in b, b
    assert unsaid not in b, b
    assert "(by step 100, its first validation: an upper bound)" in b and "needs at most " in b, b
