"""What a user types or writes is read whole and bounded: override values, YAML files (alias bombs, nesting,
size, encoding), search spaces; and the commands that read no data (sweep --dry-run, --status) need none.

The commands run with ``cli.main`` in this process (``ltfm_here``: a new process spends seconds importing torch
before it refuses anything), the alias bombs in a process of bounded memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from lightning_tfm.base.errors import UserError
from lightning_tfm.training.config import config

from conftest import ROOT, SMOKE


def _one_line(p: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit 2 with one line on stderr naming the problem, no traceback."""
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("ltfm: error: "), p.stderr[-2000:]
    for f in fragments:
        assert f in p.stderr, p.stderr


# ------------------------------------------------------------------------------------------ override values
@pytest.mark.parametrize("text,value", [
    ("data.path=/data/lf #2", "/data/lf #2"),        # YAML would read " #2" as a comment and drop it
    ("data.path=#2", "#2"),                          # YAML: a comment only, i.e. null
    ("run.name=007", "007"),                         # a str key: the text, not the integer 7
    ("run.name=yes", "yes"),                         # not True
    ("run.name=1.10", "1.10"),                       # not 1.1
    ("run.name=a  b", "a  b"),
    ("run.id=null", None),                           # an optional key is still unset by null
    ("run.name='007'", "007"),                       # quoted: YAML's string
    ("model.heads=4", 4),
    ("train.precision=32", 32),                      # a choice key: coerced to "32" by the schema
    ("wandb.tags=[a, '#b']", ["a", "#b"]),
    ("wandb.tags=[]", []),
    ("train.adam_eps=1e-9", "1e-9"),                 # YAML 1.1 text; the float key coerces it
    ("data.path=*name", "*name"),                    # not YAML: the text as given
    ("data.path=", ""),
])
def test_an_override_value_is_taken_whole(text, value):
    assert config.parse_override(text) == (text.split("=")[0], value)


@pytest.mark.parametrize("text", ["model.heads=4 # four", "wandb.tags=[a] # b", "run.name='x' # y",
                                  "train.lr_scale=2 #"])
def test_an_override_whose_comment_yaml_would_drop_is_refused(text):
    with pytest.raises(UserError, match="comment") as e:
        config.parse_override(text)
    assert "\n" not in str(e.value)


def test_prepare_and_config_read_a_path_with_a_hash_whole(tmp_path, ltfm_here):
    cfg = config.load_config(SMOKE, [f"data.path={tmp_path}/lf #2"])
    assert cfg.data.path == str(tmp_path / "lf #2")
    p = ltfm_here("prepare", SMOKE, f"data.path={tmp_path}/lf #2", f"data.cache_dir={tmp_path / 'cache'}")
    _one_line(p, "lf #2", "does not exist")  # not "{tmp_path}/lf", another folder
    (tmp_path / "lf #2").mkdir()
    p = ltfm_here("config", SMOKE, f"data.path={tmp_path}/lf #2")
    assert p.returncode == 0 and yaml.safe_load(p.stdout)["data"]["path"] == f"{tmp_path}/lf #2", p.stderr
    p = ltfm_here("config", SMOKE, f"data.path={tmp_path}", "model.heads=4 # four")
    _one_line(p, "model.heads", "comment")


# ---------------------------------------------------------------------------------------------- YAML bounds
def _bomb(levels: int = 9) -> str:
    """A billion-laughs list: 9^levels strings from a few hundred bytes of aliases."""
    v = "&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"
    for i in range(1, levels):
        v = f"&a{i} [" + ", ".join([v] + [f"*a{i - 1}"] * 8) + "]"
    return v


BOUNDED = """
import contextlib, io, json, resource, sys
resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))
from lightning_tfm.cli import main

answers = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        answers.append([main(args), out.getvalue(), err.getvalue()])
print(json.dumps(answers))
"""


def _limited(*commands, cwd=ROOT) -> list[subprocess.CompletedProcess]:
    """Each command by ``cli.main`` in one process whose heap is bounded (RLIMIT_DATA: not the shared libraries'
    mappings, which a CUDA build of torch makes large): a bomb that gets expanded fails fast instead of taking the
    machine's memory (the timeout only guards the test run). One process for all: each would spend seconds
    importing torch."""
    p = subprocess.run([sys.executable, "-c", BOUNDED, json.dumps([[str(a) for a in c] for c in commands])],
                       capture_output=True, text=True, cwd=cwd, timeout=600,
                       env={**os.environ, "WANDB_MODE": "offline"})
    assert p.returncode == 0 and not p.stderr, p.stderr[-2000:]
    return [subprocess.CompletedProcess(c, *answer) for c, answer in zip(commands, json.loads(p.stdout))]


def test_an_alias_bomb_is_refused_in_one_line_in_a_file_an_override_and_a_sweep(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"wandb:\n  tags: {_bomb()}\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"name: s\nexperiment: {SMOKE}\nvariants:\n  base: {{wandb.tags: {_bomb()}}}\n")
    in_file, in_override, *in_sweep = _limited(
        ("config", exp, f"data.path={tmp_path}"), ("config", SMOKE, f"data.path={tmp_path}", f"wandb.tags={_bomb()}"),
        ("sweep", sweep, "--dry-run", f"data.path={tmp_path}"), ("prepare", sweep), ("report", sweep))
    _one_line(in_file, "exp.yaml", "aliases")
    _one_line(in_override, "wandb.tags", "aliases")
    for p in in_sweep:
        _one_line(p, "sweep.yaml", "aliases")
    from lightning_tfm.sweep import load_sweep
    with pytest.raises(UserError, match="aliases"):
        load_sweep(sweep)


@pytest.mark.parametrize("body,fragment", [  # (the alias bomb: above, in a process of bounded memory)
    ("wandb:\n  tags: &a [*a]\n", "inside itself"),
    ("run:\n  name: " + "[" * 3000 + "]" * 3000 + "\n", "deeper"),
    ("model:\n  heads: " + "1" * 5000 + "\n", "cannot be read"),
    ("run:\n  name: x\n" + "# padding\n" * 200_000, "larger than"),
])
def test_a_config_file_beyond_the_bounds_is_refused_in_one_line(tmp_path, body, fragment):
    exp = tmp_path / "exp.yaml"
    exp.write_text(body)
    with pytest.raises(UserError, match=fragment) as e:
        config.load_config(exp, ["data.path=/x"])
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_a_config_file_that_is_not_utf8_is_refused_in_one_line(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        config.load_config(exp, ["data.path=/x"])
    exp.write_bytes("\ufeffrun:\n  name: café\n".encode())  # a byte-order mark is fine
    assert config.load_config(exp, ["data.path=/x"]).run.name == "café"


def test_anchors_within_the_bounds_still_work(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("wandb:\n  tags: &t [a, b]\nrun:\n  name: x\n")
    assert config.load_config(exp, ["data.path=/x"]).wandb.tags == ["a", "b"]


def test_an_error_message_shows_a_bounded_value():
    value = [["x"] * 1000] * 1000  # a million strings, shared: repr() would be megabytes
    with pytest.raises(UserError) as e:
        config.load_config(None, {"data.path": "/x", "wandb.tags": value})
    assert len(str(e.value)) < 300


# ------------------------------------------------------------------------------------------- search spaces
def _space_sweep(tmp_path, space: dict):
    f = tmp_path / "space.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "experiment": str(SMOKE), "n_trials": 2, "space": space}))
    return f


@pytest.mark.parametrize("space,fragment", [
    ({"model.dropout": {"type": "float", "low": 0, "high": 0.3, "log": True}}, "log: true needs low > 0"),
    ({"decode.max_len_b": {"type": "int", "low": 0, "high": 50, "log": True}}, "log: true needs low > 0"),
    ({"model.dropout": {"type": "float", "low": 0.1, "high": 0.1}}, "must be below high"),
    ({"model.dropout": {"type": "float", "low": 0.3, "high": 0.1}}, "must be below high"),
    ({"model.dropout": {"type": "float", "low": 0.0, "high": ".inf"}}, "finite number"),
    ({"model.dropout": {"type": "float", "low": "x", "high": 0.3}}, "low must be a finite number"),
    ({"model.dropout": {"type": "float", "low": 0.0, "high": 0.3, "step": 0}}, "step must be positive"),
    ({"model.dropout": {"type": "float", "low": 0.0, "high": 0.3, "step": 0.25}}, "not a multiple of step"),
    ({"model.dropout": {"type": "float", "low": 0.01, "high": 0.3, "step": 0.01, "log": True}}, "takes no step"),
    ({"model.d_model": {"type": "int", "low": 128, "high": 512, "step": 64, "log": True}}, "takes no step"),
    ({"model.d_model": {"type": "int", "low": 128, "high": 500, "step": 64}}, "not a multiple of step"),
    ({"model.d_model": {"type": "int", "low": 128, "high": 512, "step": 1.5}}, "step must be an integer"),
    ({"model.d_model": {"type": "int", "low": 128.0, "high": 512}}, "low must be an integer"),
    ({"model.dropout": {"type": "float", "low": 0.0, "high": 0.3, "log": "yes"}}, "log must be true or false"),
    ({"model.heads": {"type": "float", "low": 1, "high": 8}}, "use type: int or categorical"),
    ({"model.norm": {"type": "int", "low": 1, "high": 2}}, "use type: categorical"),
    ({"model.norm": {"type": "categorical", "choices": []}}, "non-empty list"),
    ({"model.norm": {"type": "categorical", "choices": ["pre", "pre"]}}, "repeat"),
    ({"model.norm": {"type": "categorical", "choices": [["pre"]]}}, "not a plain value"),
    ({"model.norm": {"type": "categorical", "choices": ["mid"]}}, "not one of"),
    ({"model.headz": {"type": "int", "low": 1, "high": 8}}, "unknown config key"),
    ({"model.dropout": {"type": "float", "low": 0, "high": 0.3, 1: 2, "a": 3}}, "unknown field"),
])
def test_every_search_space_entry_is_checked(tmp_path, space, fragment):
    from lightning_tfm.sweep import load_sweep

    with pytest.raises(UserError, match=fragment) as e:
        load_sweep(_space_sweep(tmp_path, space))
    assert "\n" not in str(e.value)


def test_good_search_spaces_pass(tmp_path):
    from lightning_tfm.sweep import distributions, load_sweep

    sweep = load_sweep(_space_sweep(tmp_path, {
        "model.dropout": {"type": "float", "low": "1e-5", "high": 0.3, "log": True},  # 1e-5: YAML 1.1 text
        "train.lr_scale": {"type": "float", "low": 0.5, "high": 2.0, "step": 0.25},
        "model.d_ff": {"type": "int", "low": 64, "high": 256, "step": 64},
        "train.clip_norm": {"type": "int", "low": 0, "high": 1},  # an int range of a float key
        "model.norm": {"type": "categorical", "choices": ["pre", "post"]}}))
    dist = distributions(sweep.space)
    assert dist["model.dropout"].low == 1e-5 and dist["model.d_ff"].step == 64


def test_a_bad_search_space_stops_the_dry_run_in_one_line(tmp_path, data_dir, ltfm_here):
    sweep = _space_sweep(tmp_path, {"model.dropout": {"type": "float", "low": 0, "high": 0.3, "log": True}})
    _one_line(ltfm_here("sweep", sweep, "--dry-run", f"data.path={data_dir}"), "log: true needs low > 0")


# ------------------------------------------------------------------------------- commands that read no data
def test_sweep_dry_run_and_status_need_no_data(tmp_path, data_dir, ltfm_here):
    """`ltfm sweep sweeps/table3-cpu.yaml --status` as `make ablation` and the README print it, and --dry-run."""
    from lightning_tfm.sweep import Plan, enqueue_missing, load_sweep, open_storage, open_study

    p = ltfm_here("sweep", "sweeps/table3-cpu.yaml", "--dry-run")
    assert p.returncode == 0, p.stderr
    assert "not shown without the data" in p.stdout and "base     seed 1" in p.stdout, p.stdout
    p = ltfm_here("sweep", "sweeps/smoke.yaml", "--dry-run", "--json")
    rows = json.loads(p.stdout)
    assert rows and all(r["params"] and r["run_id"] is None for r in rows), rows  # the ids need data.path
    p = ltfm_here("sweep", "sweeps/smoke.yaml", "--dry-run", "--json", f"data.path={data_dir}")
    assert all(r["run_id"].startswith(f"smoke-{r['name']}-s{r['seed']}-") for r in json.loads(p.stdout))

    results = tmp_path / "results"
    results.mkdir()
    sweep = load_sweep(ROOT / "sweeps" / "smoke.yaml")
    plan = Plan(sweep, [f"data.path={data_dir}", f"run.results_dir={results}"])
    study = open_study(sweep, open_storage(f"sqlite:///{results / 'smoke.db'}"))
    enqueue_missing(study, plan)
    p = ltfm_here("sweep", "sweeps/smoke.yaml", "--status", f"run.results_dir={results}")
    assert p.returncode == 0, p.stderr
    assert f"{len(sweep.entries())} waiting" in p.stdout, p.stdout
    p = ltfm_here("sweep", "sweeps/smoke.yaml", f"run.results_dir={results}")  # training still needs it
    _one_line(p, "data.path is not set")


# --------------------------------------------------------------------------------- sweep-file values' types
@pytest.mark.parametrize("extra,fragment", [
    ({"metric": ["dev_loss"]}, "metric"),                                  # was: TypeError (unhashable)
    ({"seeds": [[1]]}, "seeds must be"),                                    # was: TypeError (unhashable)
    ({"seeds": [-1]}, "seeds must be"),                                     # Lightning's seeding refuses it later
    ({"sampler": {"type": "tpe", "seed": float("inf")}}, "not a finite number"),  # was: OverflowError
    ({"sampler": {"type": "tpe", "seed": -3}}, "seed must be an integer"),
    ({"pruner": {"type": "threshold", "upper": float("nan")}}, "not a finite number"),  # was: never prunes
    ({"heartbeat": {"interval": 10 ** 20, "grace": 10 ** 21}}, "at most 86400"),  # was: OverflowError in a worker
    ({"variants": {"base": {"budget": float("inf")}}}, "budget must be"),   # was: OverflowError in the plan
    ({"variants": {"base": {"budget": float("nan")}}}, "budget must be"),
    ({"variants": {"base": {"seeds": [[1]]}}}, "seeds must be"),
])
def test_sweep_file_values_of_the_wrong_kind_are_one_line(tmp_path, extra, fragment):
    from lightning_tfm.sweep import load_sweep

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "experiment": str(SMOKE), "variants": {"base": {}}, **extra}))
    with pytest.raises(UserError, match=fragment) as e:
        load_sweep(f)
    assert "\n" not in str(e.value)


def test_a_run_seed_lightning_cannot_take_is_refused_before_the_run():
    with pytest.raises(UserError, match="run.seed"):
        config.load_config(SMOKE, ["data.path=/x", "run.seed=-1"])
    with pytest.raises(UserError, match="run.seed"):
        config.load_config(SMOKE, ["data.path=/x", f"run.seed={2 ** 32}"])


def test_a_sweep_value_printed_as_an_override_reads_back_whole():
    """The dry run prints each row's values as dotted.key=value (yaml_value): pasted back on a command line, a
    variant's string with " #", a number-like or a yes-like string reads back exactly."""
    from lightning_tfm.sweep import yaml_value

    for key, value in [("data.path", "/data/lf #2"), ("run.name", "007"), ("run.name", "yes"), ("run.name", " x"),
                       ("run.name", "a: b"), ("wandb.tags", ["#a", "b # c"]), ("model.heads", 4), ("run.id", None)]:
        assert config.parse_override(f"{key}={yaml_value(value)}") == (key, value), value


# ------------------------------------------------------------------------------------------- repeated keys
# (#64 item 6) PyYAML keeps the last of a repeated key silently: a second `model:` replaced the file's model whole, a
# variant written twice dropped the first row, a second `overrides:` dropped the first's data.path.
REPEATED = {
    "model": ("experiment", "model:\n  layers: 2\n  d_model: 64\ntrain:\n  max_steps: 5\nmodel:\n  heads: 4\n", 1, 6),
    "layers": ("experiment", "model:\n  layers: 2\n  d_model: 64\n  layers: 3\n", 2, 4),
    "A1": ("sweep", "name: s\nexperiment: {smoke}\nvariants:\n  A1: {{model.heads: 1}}\n  base: {{}}\n"
                    "  A1: {{model.heads: 2}}\n", 4, 6),
    "overrides": ("sweep", "name: s\nexperiment: {smoke}\noverrides:\n  data.path: /d\nvariants:\n  base: {{}}\n"
                           "overrides:\n  train.max_steps: 5\n", 3, 7),
    "model.heads": ("sweep", "name: s\nexperiment: {smoke}\nvariants:\n  base: {{model.heads: 1, model.heads: 2}}\n",
                    4, 4),
}


@pytest.mark.parametrize("key", REPEATED)
def test_a_repeated_key_is_one_line_naming_it_and_its_lines(key, tmp_path, ltfm_here):
    kind, body, first, second = REPEATED[key]
    f = tmp_path / f"{kind}.yaml"
    f.write_text(body.format(smoke=SMOKE))
    lines = f"lines {first} and {second}" if first != second else f"line {first}"
    commands = [("config", f, f"data.path={tmp_path}")] if kind == "experiment" else \
        [("sweep", f, "--dry-run"), ("prepare", f), ("report", f, "--out", tmp_path / "out")]
    for command in commands:
        _one_line(ltfm_here(*command), f"{kind}.yaml", f"repeats the key '{key}' ({lines})", "keep one")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f.name]  # nothing written


@pytest.mark.parametrize("text", ["a: {b: 1, b: 2}", "a: [{x: 1}, {y: [{z: 1, z: 1}]}]", "1: a\n0x1: b",
                                  "a: 1\nb: {c: 1}\na: 1"])
def test_a_repeated_key_is_found_at_any_depth(text):
    from lightning_tfm.base.inputs import load_yaml

    with pytest.raises(UserError, match="repeats the key"):
        load_yaml(text, "config file 'x.yaml'")
    with pytest.raises(UserError, match="repeats the key"):  # an override's value is read by the same loader
        config.parse_override(f"wandb.tags={{{text.replace(chr(10), ', ')}}}")


def test_keys_a_merge_brings_may_be_overridden():
    from lightning_tfm.base.inputs import load_yaml

    text = "base: &b {x: 1, y: 2}\nrow:\n  <<: *b\n  x: 3\nnested: &n {<<: *b, y: 4}\nlast: {<<: *n, y: 5}\n"
    assert load_yaml(text, "t") == {"base": {"x": 1, "y": 2}, "row": {"x": 3, "y": 2}, "nested": {"x": 1, "y": 4},
                                    "last": {"x": 1, "y": 5}}


# ------------------------------------------------------------------------------------------- data.path typos
# (#64 item 17) A typo in data.path passed `ltfm config` (exit 0, a run id), and `ltfm train` said so a minute later,
# after importing Lightning.
@pytest.mark.parametrize("command", [["config"], ["train"], ["prepare"]])
def test_a_data_path_typo_is_one_line_naming_the_closest_folder(command, data_dir, tmp_path, ltfm_here):
    typo = f"{data_dir}x"
    p = ltfm_here(*command, SMOKE, f"data.path={typo}", f"run.results_dir={tmp_path / 'results'}",
                  f"data.cache_dir={tmp_path / 'cache'}")
    _one_line(p, f"data folder '{typo}' does not exist", f"did you mean '{data_dir}'?", "data.path=", "DATA=")
    assert list(tmp_path.iterdir()) == []
    deeper = data_dir.parent.parent / (data_dir.parent.name + "x") / data_dir.name  # a typo in a parent's name
    p = ltfm_here(*command, SMOKE, f"data.path={deeper}", f"run.results_dir={tmp_path / 'results'}")
    _one_line(p, "does not exist", f"did you mean '{data_dir}'?")
    p = ltfm_here(*command, SMOKE, f"data.path={SMOKE}", f"run.results_dir={tmp_path / 'results'}")
    _one_line(p, "is a file, not a folder")


def test_a_sweep_with_a_data_path_typo_stops_before_any_trial(data_dir, tmp_path, ltfm_here):
    results = tmp_path / "results"
    p = ltfm_here("sweep", ROOT / "sweeps" / "smoke.yaml", f"data.path={data_dir}x", f"run.results_dir={results}")
    _one_line(p, f"data folder '{data_dir}x' does not exist", f"did you mean '{data_dir}'?", "DATA=")
    assert not any(results.rglob("summary.json"))


def test_train_refuses_a_data_path_typo_before_importing_lightning(data_dir, tmp_path):
    """The check comes before the heavy imports: a new process (as a user runs it) has not imported Lightning."""
    code = ("import sys; from lightning_tfm.cli import main; "
            f"code = main(['train', {str(SMOKE)!r}, 'data.path={data_dir}x', 'run.results_dir={tmp_path}']); "
            "print(code, 'pytorch_lightning' in sys.modules, 'lightning' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                       env={**os.environ, "WANDB_MODE": "offline"})
    assert p.stdout.split() == ["2", "False", "False"], (p.stdout, p.stderr[-2000:])
    assert "does not exist" in p.stderr and list(tmp_path.iterdir()) == []
