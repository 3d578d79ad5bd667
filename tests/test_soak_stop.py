"""``make soak`` stopped by a signal (issue 44): SIGTERM, SIGINT or SIGHUP to the soak (tests/soak/soak.py, a real
process) stops its workers, its PostgreSQL server and removes its tmpfs mounts and work folder, with one line saying
so. Each test waits for the line the soak prints once what it must clean up is there (a worker started, the server
up), then sends the signal: no sleep."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT, default_signals

SOAK = ROOT / "tests" / "soak" / "soak.py"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the soak mounts tmpfs folders: it runs as root")]


def start_soak(tmp_path: Path, data_dir: Path, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(SOAK), "--seed", "1", "--out", str(tmp_path / "out"), "--data",
                             str(data_dir), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}, cwd=ROOT,
                            preexec_fn=default_signals)  # as a terminal delivers them, however the suite runs
    watchdog = threading.Timer(300, proc.kill)  # a soak that never says it is ready fails the test, never hangs it
    watchdog.daemon = True
    watchdog.start()
    return proc


def read_until(proc: subprocess.Popen, pattern: str) -> tuple[list[str], re.Match]:
    """The soak's stdout lines up to the first that matches ``pattern`` (and the match)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if m := re.search(pattern, line):
            return lines, m
    proc.wait()
    pytest.fail(f"the soak ended (exit {proc.returncode}) before printing {pattern!r}: {''.join(lines)[-2000:]} "
                f"{proc.stderr.read()[-2000:]}")


def stopped(proc: subprocess.Popen, sig: signal.Signals, said: str) -> None:
    """Sends ``sig``; the soak ends with 128 + the signal's number and one line on stderr, ``said`` (a pattern)."""
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert err.count("\n") == 1 and "Traceback" not in err, err[-3000:]
    assert re.match(f"soak: stopped by {sig.name}: {said}; the logs so far are in ", err), err


def mounted(path: str) -> bool:
    return any(line.split()[1].startswith(path) for line in Path("/proc/mounts").read_text().splitlines())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def processes_in(folder: str) -> list[int]:
    """The processes whose command line names ``folder`` (a PostgreSQL server's data folder)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and folder in Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                out.append(int(d))
        except OSError:
            continue
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_a_signal_stops_the_soak_its_workers_and_removes_its_work(tmp_path, data_dir, sig):
    """The short soak (SOAK_ARGS="--storages sqlite --no-search --rows 4"), stopped once its first worker started."""
    proc = start_soak(tmp_path, data_dir, "--storages", "sqlite", "--no-search", "--rows", "4")
    lines, m = read_until(proc, r"start worker worker=0 pid=(\d+)")
    work = re.search(r"work in (/tmp/ltfm-soak-\d+)", "".join(lines)).group(1)
    assert Path(work).is_dir() and mounted(work)
    stopped(proc, sig, rf"\d+ workers? stopped, {work} unmounted and removed")
    assert gone(int(m.group(1))), "the worker still runs"
    assert not Path(work).exists() and not mounted(work)
    assert (tmp_path / "out" / "chaos.log").is_file()  # what it logged so far stays


def test_sigterm_stops_the_soaks_postgresql_server(tmp_path, data_dir):
    """The smallest soak that starts a server (--storages postgresql --rows 1), stopped once the server is up."""
    from pg import find_pg_bin

    if find_pg_bin() is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl): .ci/run installs Debian's postgresql")
    proc = start_soak(tmp_path, data_dir, "--storages", "postgresql", "--rows", "1", "--workers", "1")
    lines, m = read_until(proc, r"PostgreSQL server up on 127\.0\.0\.1:\d+, folder (\S+)")
    work = re.search(r"work in (/tmp/ltfm-soak-\d+)", "".join(lines)).group(1)
    server = m.group(1)
    assert processes_in(server), "no server process names its folder"
    # its worker started or not yet
    stopped(proc, signal.SIGTERM, f"[01] workers? stopped, the PostgreSQL server stopped and removed, {work} unmounted "
                                  "and removed")
    assert processes_in(server) == [], "the PostgreSQL server still runs"
    assert not Path(server).exists() and not Path(work).exists() and not mounted(work)
