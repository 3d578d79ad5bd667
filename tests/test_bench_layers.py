"""``ltfm bench --layers``: the paper's Table 1 measured. The tests run it at tiny sizes and check what it prints
and writes, the slope fit and the step it times; no test looks at a timing's value, so the machine's speed
cannot change an outcome."""
from __future__ import annotations

import csv
import json

import pytest

from lightning_tfm import cli
from lightning_tfm.bench import layers as bl

KINDS = ["self-attention", "gru", "lstm", "conv"]


def test_tiny_run_prints_the_table_and_writes_the_figure(tmp_path, capsys):
    out = tmp_path / "layers"
    assert cli.main(["bench", "--layers", "--d-model", "16", "--lengths", "4,8", "--out", str(out),
                     "bench.run_ms=2", "bench.threads=1", "bench.batch=2", "bench.reps=2"]) == 0
    p_out = capsys.readouterr().out
    lines = p_out.splitlines()
    # the timing table: a header naming every layer type, one row per (d_model, n), two figures per layer
    (names,) = [line for line in lines if all(k in line for k in KINDS) and "|" in line]
    assert [c.strip() for c in names.split("|")[1:]] == KINDS
    rows = [line.split() for line in lines if line.split()[:2] in (["16", "4"], ["16", "8"])]
    assert [r[:2] for r in rows] == [["16", "4"], ["16", "8"]]
    for r in rows:
        times = [float(x) for x in r[2:] if x != "|"]
        assert len(times) == 2 * len(KINDS) and all(t > 0 for t in times)
    # the slopes, beside the paper's complexity and sequential operations
    slopes = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in KINDS}
    assert set(slopes) == set(KINDS)
    assert "O(n^2 d)" in slopes["self-attention"] and "O(n d^2)" in slopes["gru"] and "O(k n d^2)" in slopes["conv"]
    assert "O(n): 8 at 8" in slopes["gru"] and "O(1): 1 at 8" in slopes["self-attention"]
    (machine,) = [line for line in lines if line.startswith("one layer, batch 2 sentences")]
    assert "1 threads" in machine and "torch" in machine and "cores" in machine
    assert "best block over 2 passes" in p_out
    # the files: the figure (PNG and SVG), the CSV (a row per layer and length), the JSON
    assert (out / "layers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (out / "layers.svg").read_bytes()[:1000]
    with open(out / "layers.csv") as f:
        table = list(csv.DictReader(f))
    assert sorted((r["layer"], int(r["n"])) for r in table) == sorted((k, n) for k in KINDS for n in (4, 8))
    assert {int(r["sequential_ops"]) for r in table if r["layer"] == "gru" and r["n"] == "8"} == {8}
    r = json.loads((out / "layers.json").read_text())
    assert r["threads"] == 1 and r["lengths"] == [4, 8] and r["d_models"] == [16] and len(r["slopes"]) == 4
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_slope_fit_recovers_a_known_exponent_over_the_upper_half():
    ns = [8, 16, 32, 64, 128, 256]
    assert bl.upper_half(ns) == [64, 128, 256]
    assert bl.fit_slope(ns, [3e-6 * n**2 for n in ns]) == pytest.approx(2.0)
    assert bl.fit_slope(ns, [0.5 * n**1.5 for n in ns]) == pytest.approx(1.5)
    # a fixed cost that dominates the short lengths does not reach the fit: flat up to 32, then n^2
    flat_then_square = [1.0 if n <= 32 else (n / 32) ** 2 for n in ns]
    assert bl.fit_slope(ns, flat_then_square) == pytest.approx(2.0)
    # given in any order; fewer than two lengths have no slope
    assert bl.fit_slope(ns[::-1], [n**1.0 for n in ns[::-1]]) == pytest.approx(1.0)
    assert bl.fit_slope([8], [1.0]) is None


def test_flop_count_of_self_attention_tends_to_the_papers_exponent_past_d():
    """The FLOP slope printed beside the measured one: a self-attention layer's projections make it ~1 while
    n << d, the paper's n^2 d term makes it ~2 once n >> d; a recurrent layer is n d^2 throughout."""
    slope = lambda kind, ns, d: bl.fit_slope(ns, [bl.forward_flops(kind, n, d) for n in ns])  # noqa: E731
    assert slope("self-attention", [1, 2, 4], 4096) == pytest.approx(1.0, abs=0.01)
    assert slope("self-attention", [2**14, 2**15, 2**16], 16) == pytest.approx(2.0, abs=0.01)
    assert slope("gru", [8, 64, 256], 128) == pytest.approx(1.0)
    assert bl.forward_flops("self-attention", 10, 8) == 8 * 10 * 64 + 4 * 100 * 8


def test_self_attention_step_is_one_new_query_against_n_keys(monkeypatch):
    """The decoding step times the model's attention with the model's cache: n keys and values, the newest one
    appended to n - 1 earlier positions."""
    seen = []

    class Recording(bl.KVCache):
        def append(self, k, v):
            out = super().append(k, v)
            seen.append((k.shape[2], out[0].shape[2]))
            return out

    monkeypatch.setattr(bl, "KVCache", Recording)
    layer = bl.build_layer("self-attention", 16, bl.SETTINGS)
    assert isinstance(layer, bl.MultiHeadAttention) and layer.heads == bl.SETTINGS["heads"]
    for n in (1, 5):
        bl.make_step("self-attention", layer, 16, n, batch=3)()
    assert seen == [(1, 1), (1, 5)]


@pytest.mark.parametrize("args, message", [
    (["--lengths", "0"], "--lengths '0': give positive integers"),
    (["--lengths", "8,x"], "--lengths '8,x': give positive integers"),
    (["--d-model", "big"], "--d-model 'big': give positive integers"),
    (["--d-model", "18"], "--d-model 18 is not a multiple of bench.heads=4"),
    (["bench.run_ms=0"], "bench.run_ms=0: must be at least 1"),
    (["bench.layers=2"], "takes bench.<name>=N settings, not 'bench.layers=2'"),
    (["--vs", "marian"], "--vs does not apply to --layers"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert cli.main(["bench", "--layers", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ltfm: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # nothing written


def test_layer_options_without_layers_and_an_out_file_are_errors(tmp_path, capsys):
    assert cli.main(["bench", "--lengths", "8,16"]) == 2
    assert "--lengths goes with --layers" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("")
    assert cli.main(["bench", "--layers", "--out", str(f)]) == 2
    assert "is a file: give a folder" in capsys.readouterr().err



@pytest.mark.parametrize("where", ["proc", "under a file", "long name"])
def test_bench_out_is_checked_like_every_other_output(tmp_path, capsys, where):
    """#52 item 11's sibling: ``ltfm bench --layers --out`` goes through the check every command's output does
    (base/atomic.check_writable), before any timing: /proc (which os.access calls writable for root), a folder
    under a file, a name over 255 bytes; one line, exit 2, nothing written."""
    (tmp_path / "file").write_text("x")
    out = {"proc": "/proc/ltfm-bench", "under a file": str(tmp_path / "file" / "out"),
           "long name": str(tmp_path / ("x" * 300))}[where]
    assert cli.main(["bench", "--layers", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ltfm: error: --out ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
