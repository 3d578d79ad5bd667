"""The suite's selections are pytest markers on the tests themselves (issue #45): ``make test`` leaves out ``-m long``,
``make test-fast`` ``-m slow``, ``make bench`` runs ``-m marian``; the optional tests (cuda, marian) are skipped, with
the way to run them, where what they need is missing (conftest's ``OPTIONAL``). A list of test names in conftest let a
renamed long test rejoin ``make test``; with markers, a misspelt one would be a new marker nobody selects, and a
misspelt ``-m`` expression would select everything: pyproject.toml's ``--strict-markers`` makes both errors.

Each test runs pytest on a small test file of its own, in a new process, with the project's pytest configuration."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from conftest import ROOT


def pytest_on(tmp_path, source: str, *args: str, conftest: str | None = None) -> subprocess.CompletedProcess:
    """``pytest --collect-only`` (or ``args``) on ``source`` written to tmp_path/test_it.py, configured by the
    project's pyproject.toml (its addopts and markers); rooted in tmp_path, so nothing is written in the checkout."""
    (tmp_path / "test_it.py").write_text(textwrap.dedent(source))
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(textwrap.dedent(conftest))
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
                           "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-p", "no:xdist", *args,
                           str(tmp_path / "test_it.py")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)


def make_selection(target: str) -> str:
    """The ``-m`` expression of a Makefile target's pytest line."""
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, f"no {target} target in the Makefile"
    (expression,) = re.findall(r'-m ("[^"]+"|\S+)', recipe.group(1))
    return expression.strip('"')


TWO_TESTS = """
    import pytest

    @pytest.mark.{marker}
    def test_a_long_one_under_any_name():
        pass

    def test_a_short_one():
        pass
"""


def test_make_test_leaves_out_a_test_marked_long_whatever_its_name_and_a_misspelt_marker_is_an_error(tmp_path):
    selection = make_selection("test")
    p = pytest_on(tmp_path, TWO_TESTS.format(marker="long"), "--collect-only", "-q", "-m", selection)
    assert p.returncode == 0 and "test_a_short_one" in p.stdout, p.stdout + p.stderr
    assert "test_a_long_one_under_any_name" not in p.stdout
    assert "test_a_long_one_under_any_name" in pytest_on(tmp_path, TWO_TESTS.format(marker="long"), "--collect-only",
                                                         "-q", "-m", make_selection("test-long")).stdout
    # misspelt: without --strict-markers a new marker, the test back in make test with a warning
    p = pytest_on(tmp_path, TWO_TESTS.format(marker="lnog"), "--collect-only", "-q", "-m", selection)
    assert p.returncode != 0 and "'lnog' not found in `markers` configuration option" in p.stdout, p.stdout + p.stderr


def test_a_selection_naming_an_unknown_marker_is_an_error_not_the_whole_suite(tmp_path):
    p = pytest_on(tmp_path, TWO_TESTS.format(marker="long"), "-q", "-m", "not lnog")
    assert p.returncode != 0 and "Unknown marker(s) in '-m' expression: lnog" in p.stderr, p.stdout + p.stderr
    assert "passed" not in p.stdout, p.stdout


def test_a_marian_test_without_transformers_is_skipped_naming_make_bench(tmp_path):
    """The suite's own hook (conftest.py's pytest_collection_modifyitems), where transformers cannot be imported."""
    hook = f"""
        import importlib.util
        import sys

        sys.modules["transformers"] = None  # as where it is not installed: import fails
        sys.path.insert(0, {str(ROOT / "tests")!r})
        spec = importlib.util.spec_from_file_location("suite_conftest", {str(ROOT / "tests" / "conftest.py")!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        pytest_collection_modifyitems = suite.pytest_collection_modifyitems
    """
    p = pytest_on(tmp_path, TWO_TESTS.format(marker="marian"), "-q", "-rs", conftest=hook)
    assert p.returncode == 0 and "1 passed, 1 skipped" in p.stdout, p.stdout + p.stderr
    (line,) = [line for line in p.stdout.splitlines() if line.startswith("SKIPPED")]
    assert "test_it.py:4" in line and "transformers" in line and "make bench" in line and ".[bench]" in line, line


def test_the_fixtures_and_files_conftest_selects_by_name_exist():
    """What conftest still selects by name: a test using one of SLOW_FIXTURES is marked slow (a renamed fixture
    would silently put its tests back into make test-fast), and LONGEST_FIRST orders the files."""
    import ast

    import conftest

    fixtures = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
                fixtures.add(node.name)
    assert conftest.SLOW_FIXTURES <= fixtures, conftest.SLOW_FIXTURES - fixtures
    assert [name for name in conftest.LONGEST_FIRST if not (ROOT / "tests" / name).is_file()] == []
