"""Values at their limits (issue #44): every number key has a range, every name fits a file name, every cost knob
has a ceiling; each is one line naming the key and the allowed range, exit 2, before anything is written or
trained (in-process and direct calls: no training)."""
from __future__ import annotations

import pytest
import yaml

from lightning_tfm.base.errors import UserError
from lightning_tfm.base.knobs import OPT
from lightning_tfm.training.config import config

from conftest import ROOT, SMOKE

RNN = ROOT / "experiments" / "multi30k-rnn-smoke.yaml"
BIG = 10 ** 20


def test_every_number_key_refuses_a_huge_value():
    """The siblings of model.max_positions=1e20: every int and float key of `ltfm config --keys` (the rnn
    section's with model.arch rnn) refuses 10**20 and 1e308 by name."""
    accepted = []
    for sec, keys in config.SCHEMA.items():
        for name, (spec, _, _) in keys.items():
            kind = spec[1] if isinstance(spec, tuple) and spec[0] == OPT else spec
            if kind not in (int, float):
                continue
            key = f"{sec}.{name}"
            for value in ((BIG,) if kind is int else (1e308, -1e308)):
                try:
                    config.load_config(RNN if sec == "rnn" else SMOKE, {"data.path": "/x", key: value})
                    accepted.append(f"{key}={value}")
                except UserError as e:
                    assert key in str(e) and "\n" not in str(e), str(e)
    assert accepted == []


LONG = "x" * 250


@pytest.mark.parametrize("experiment,override,words", [
    (SMOKE, f"model.max_positions={BIG}", f"model.max_positions={BIG} must be a positive integer, at most 65536"),
    (RNN, f"rnn.max_positions={BIG}", f"rnn.max_positions={BIG} must be a positive integer, at most 65536"),
    (SMOKE, f"decode.max_len_b={BIG}", f"decode.max_len_b={BIG} must be 0 or more, at most 65536"),
    (SMOKE, f"train.max_steps={BIG}", "train.max_steps"),
    (SMOKE, "train.max_time_minutes=1e+308", "train.max_time_minutes=1e+308 must be positive, at most 10000000"),
    (SMOKE, "train.max_time_minutes=0", "train.max_time_minutes=0.0 must be positive, at most 10000000"),  # one range
    (SMOKE, f"run.name={LONG}", "is 259 bytes, over the 255 of a folder name: shorten run.name (at most 246 bytes)"),
    (SMOKE, f"run.name={'é' * 124}", "is 257 bytes, over the 255 of a folder name: shorten run.name (at most 246"),
    (SMOKE, f"run.id={'x' * 256}", "shorten run.id (at most 255 bytes)"),
    (SMOKE, f"run.variant={'v' * 101}", "run.variant='vvv"),
    (SMOKE, "run.family=a\tb", "run.family='a\\tb' must be one line of 1 to 100 printable characters"),
    (SMOKE, "run.variant=' '", "run.variant=' ' must be one line of 1 to 100 printable characters, not blank"),
    (SMOKE, f"run.results_dir=/tmp/{'r' * 256}", "run.results_dir='/tmp/rrr"),
    (SMOKE, "data.path=/x/a\0b", "data.path='/x/a\\x00b' is not a path the file system takes"),
    (SMOKE, "data.src_lang=e/n", "data.src_lang='e/n' must be a plain name of at most 100 characters"),
    (SMOKE, "wandb.project=a:b", "wandb.project='a:b' must be at most 128 characters, none of"),
])
def test_a_value_at_the_limit_is_one_line_naming_the_key_and_the_range(ltfm_here, experiment, override, words):
    p = ltfm_here("config", experiment, "data.path=/x", override)
    assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr[-500:]
    assert p.stdout == ""


def test_a_sweep_trials_run_id_over_255_bytes_names_study_and_variant():
    cfg = config.load_config(SMOKE, {"data.path": "/x", "run.study": "s" * 100, "run.variant": "v" * 150},
                             checked=False)
    with pytest.raises(UserError, match=r"is 263 bytes, .* shorten run.study and run.variant \(at most 242 bytes\)"):
        config.validate(cfg)


GOOD = {"name": "s", "experiment": str(SMOKE), "variants": {"base": {}}}
SPACE = {"name": "s", "experiment": str(SMOKE), "space": {"model.dropout": {"type": "float", "low": 0, "high": 0.3}}}


@pytest.mark.parametrize("body,words", [
    ({**GOOD, "report": {"bootstraps": 100000, "family": "saturating"}},
     "report.bootstraps must be an integer from 20"),
    ({**GOOD, "report": {"bootstraps": 5000, "family": "saturating"}},
     "report.bootstraps 5000 with family saturating must be an integer from 20 to 2000"),
    ({**GOOD, "pruner": {"type": "curve", "bootstraps": 3000, "family": "exponential"}},
     "pruner.bootstraps 3000 with family exponential must be an integer from 20 to 2000"),
    ({**GOOD, "budget": {"equal": "flops", "src_len": 1e308}}, "budget.src_len must be a number of tokens from 1 to "
                                                               "65536"),
    ({**GOOD, "budget": {"equal": "flops", "tgt_len": "1e308"}}, "budget.tgt_len must be a number of tokens from 1"),
    ({**GOOD, "variants": {"v" * 250: {}}}, "must be at most 100 letters"),
    ({**GOOD, "name": "n" * 200}, "name must be set to at most 100 letters"),
    ({**GOOD, "variants": {"A1": {"family": "f" * 300}}}, "variant A1: family must be a name such as A or norm (one "
                                                         "line, at most 100"),
    ({**GOOD, "seeds": list(range(101))}, "seeds must be a non-empty list of at most 100"),
    ({**SPACE, "n_trials": BIG}, "n_trials must be a positive integer, at most 10000"),
    ({**GOOD, "pruner": {"type": "curve", "final_step": BIG}},
     "pruner final_step must be null or an integer from 1 to"),
    ({**GOOD, "pruner": {"type": "curve", "warmup": BIG}}, "pruner warmup must be null or an integer from 0 to"),
    ({**GOOD, "overrides": {"decode.max_len_b": BIG}}, f"overrides: decode.max_len_b={BIG} must be 0 or more, at most"),
    ({**GOOD, "variants": {"A1": {"model.max_positions": BIG}}}, "variant A1: model.max_positions="),
    ({**SPACE, "space": {"model.max_positions": {"type": "int", "low": 8, "high": BIG}}},
     "space model.max_positions: model.max_positions="),
    ({**SPACE, "space": {"model.layers": {"type": "categorical", "choices": [2, BIG]}}},
     "space model.layers: model.layers="),
    ({**SPACE, "space": {"train.label_smoothing": {"type": "int", "low": 0, "high": 1}}},  # [0, 1): one range too
     "space train.label_smoothing: train.label_smoothing=1.0 must be in [0, 1)"),
    ({**GOOD, "variants": {"A1": {"rnn.dropout": 1}}}, "variant A1: rnn.dropout=1.0 must be in [0, 1)"),
])
def test_a_sweep_file_value_at_the_limit_is_refused_when_loaded(tmp_path, body, words):
    from lightning_tfm.sweep import load_sweep

    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump(body))
    with pytest.raises(UserError) as e:
        load_sweep(f)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_corpus_length_limit_is_the_architectures_own_max_positions(tmp_path):
    """rnn.max_positions, not the model section's (unused by the rnn) bounds the training and dev sentences."""
    from lightning_tfm.training.data import corpus

    from test_prepare import small_corpus

    cfg = config.load_config(RNN, [f"data.path={small_corpus(tmp_path / 'data')}", f"run.results_dir={tmp_path}",
                                   "data.max_train_pairs=null", "data.vocab_size=100", "rnn.max_positions=8"])
    c = corpus.Corpus(cfg, progress=False)
    assert c.limit == 7 and c.summary()["length_limit"] == 7
    assert c.skipped > 0 and c.truncated["dev"] > 0
    assert max(len(c.dev[i][1]) for i in range(len(c.dev))) == 7


@pytest.mark.parametrize("args,words", [
    (["bench.batch=0"], "bench.batch=0 must be from 1 to 65536"),
    ([f"bench.reps={BIG}"], f"bench.reps={BIG} must be from 1 to 100"),
    (["bench.src_len=5000"], "bench.src_len=5000 does not fit the model's 1024 positions"),
    (["--vs", "marian", "bench.out_len=600"], "bench.out_len=600 does not fit the model's 512 positions"),
    (["--layers", f"bench.batch={BIG}"], f"bench.batch={BIG}: must be from 1 to 4096"),
    (["--layers", "--lengths", str(BIG)], "give at most 32 values from 1 to 8192"),
    (["--layers", "--d-model", "1000000"], "--d-model '1000000': give at most 32 values from 1 to 8192"),
    (["--layers", "--lengths", "8192", "bench.batch=64"], "batch x heads x n^2 scores pass"),
])
def test_a_bench_setting_at_the_limit_is_one_line(ltfm_here, tmp_path, args, words):
    p = ltfm_here("bench", "--device", "cpu", "--out" if "--layers" in args else "--json", *(
        [str(tmp_path / "out")] if "--layers" in args else []), *args)
    assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr[-500:]
    assert not (tmp_path / "out").exists()


def test_bench_data_refuses_a_count_it_could_not_generate(tmp_path):
    from lightning_tfm.bench.pipeline import bench_data

    with pytest.raises(UserError, match=f"--data {BIG}: give the number of pairs to generate, from 2 to"):
        bench_data(BIG, source=tmp_path, work=tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_a_hand_trained_runs_long_variant_is_refused_before_the_export_is_written(tmp_path):
    """A run trained before run.variant was bounded: the export refuses it before writing (in the notebook: one
    line, exit 2, the staging folder removed), not after the report is published. A run folder named with a
    space (run.name 'my run') is a name the export takes."""
    from types import SimpleNamespace

    from lightning_tfm.report.inputs.export import check_tree, write_export
    from lightning_tfm.report.inputs.records import ReportData, RunRecord

    sweep = SimpleNamespace(name="s", path=tmp_path / "s.yaml")
    table = SimpleNamespace(bootstrap=({}, [], None), run_info=None)
    ok = ReportData(sweep, [RunRecord(variant="base", seed=1, run=str(tmp_path / "my run-0123abcd"))], "runs", {})
    check_tree(yaml.safe_load(write_export(ok, table, tmp_path / "export").read_text()))
    bad = ReportData(sweep, [RunRecord(variant="v" * 150, seed=1)], "runs", {})
    with pytest.raises(UserError, match=r"export of sweep s: record 0: variant is 'v+\.\.\.', longer than 100 "
                                        r"characters: fix that run's config.yaml"):
        write_export(bad, table, tmp_path / "export2")
    assert not (tmp_path / "export2").exists()
