"""The overrides given to ``evaluate`` and ``translate`` are checked as ``ltfm train``'s and ``ltfm config``'s are
(issue #52, item 10): ``translate RUN decode.max_len_b=100000000000000000000`` ended in an OverflowError. Each bad
value is the same one-line error as ``ltfm config`` gives for it, exit 2, before any decoding, nothing written."""
from __future__ import annotations

import pytest

from conftest import SMOKE
from test_run_reuse import tiny_run, vocabularies  # noqa: F401  (a fixture)

BAD = ["decode.max_len_b=100000000000000000000", "decode.max_len_a=-1", "decode.beam_size=0",
       "decode.beam_size=100000000000000000000", "decode.length_penalty=.nan", "decode.length_penalty=inf",
       "decode.batch_sentences=0", "decode.average_last=-1", "data.max_test_pairs=-5", "decode.beam_size=two",
       "decode.beam_sise=2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_dir, vocabularies):  # noqa: F811
    return tiny_run(tmp_path_factory.mktemp("results") / "tiny", data_dir, vocabularies["de"])


def error_line(p) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: ") and "Traceback" not in p.stderr, p.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("override", BAD)
def test_a_bad_override_is_the_config_checks_one_line_error(override, run, data_dir, tmp_path, ltfm_here):
    expected = error_line(ltfm_here("config", SMOKE, f"data.path={data_dir}", override))
    assert error_line(ltfm_here("translate", run, override, input="A dog runs.\n")) == expected
    src = tmp_path / "src.en"
    src.write_text("A dog runs.\n")
    assert error_line(ltfm_here("evaluate", run, "--src", src, "--ref", src, override)) == expected
    assert not (run / "hyps").exists()


def test_the_checks_across_keys_apply_too(run, ltfm_here):
    line = error_line(ltfm_here("translate", run, "decode.max_len_a=0", "decode.max_len_b=0", input="A dog.\n"))
    assert "decode.max_len_a=0 and decode.max_len_b=0" in line


def test_good_overrides_still_decode(run, ltfm_here):
    p = ltfm_here("translate", run, "decode.max_len_b=3", "decode.beam_size=1", "decode.length_penalty=1.0",
                  input="A dog runs.\nTwo men.\n")
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 2, p.stderr[-2000:]
