"""A throwaway PostgreSQL cluster for the sweep tests: real server, loopback only, password-protected.

``initdb`` into a temporary folder (as the ``postgres`` user when the tests run as root: the server refuses
to run as root), ``pg_ctl start`` on a free 127.0.0.1 port with its unix socket inside that folder, TCP logins
by password (scram-sha-256). Stopped and deleted at the end of the session. Debian's ``postgresql`` package
provides the binaries (``.ci/run`` installs it where missing).

Use the ``postgres`` fixture (session) or ``pg_url`` (a fresh database per test)::

    from pg import pg_url, postgres  # noqa: F401  (pytest finds fixtures imported into a test module)
"""
from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest


def find_pg_bin() -> Path | None:
    """The newest PostgreSQL server bin folder (Debian: /usr/lib/postgresql/<major>/bin), or PATH."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    root: Path
    port: int
    user: str
    password: str
    run_as: list[str]
    bin: Path
    opts: str = ""

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                                dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)

    def stop(self, mode: str = "immediate") -> None:
        subprocess.run([*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-m", mode,
                        "-w", "stop"], capture_output=True, timeout=60)

    def start(self) -> subprocess.CompletedProcess:
        """Start the server again on the same port (after :meth:`stop`)."""
        return subprocess.run([*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-o", self.opts,
                               "-l", str(self.root / "server.log"), "-w", "-t", "60", "start"],
                              capture_output=True, text=True, timeout=120)


def start_server() -> PgServer:
    pg_bin = find_pg_bin()
    if pg_bin is None:
        pytest.fail("PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's postgresql "
                    "package (.ci/run does) to run the PostgreSQL sweep tests")
    root = Path(tempfile.mkdtemp(prefix="ltfm-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root but there is no 'postgres' user to run the throwaway server")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    password = "pw" + secrets.token_hex(12)
    user = "ltfm"
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")
    if run_as:
        os.chown(pwfile, pw.pw_uid, pw.pw_gid)
    os.chmod(pwfile, 0o600)
    sock = root / "sock"
    sock.mkdir()
    if run_as:
        os.chown(sock, pw.pw_uid, pw.pw_gid)
    init = subprocess.run([*run_as, str(pg_bin / "initdb"), "-D", str(root / "data"), "-U", user,
                           f"--pwfile={pwfile}", "--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
                           "-E", "UTF8", "--no-sync", "--no-instructions"],
                          capture_output=True, text=True, timeout=180)
    pwfile.unlink()
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"initdb failed: {init.stderr[-2000:]}")
    server = None
    for _ in range(3):  # a free port can be taken between probing and binding: try another
        port = free_port()
        opts = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={sock} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50")
        candidate = PgServer(root, port, user, password, run_as, pg_bin, opts)
        start = candidate.start()
        if start.returncode == 0:
            server = candidate
            break
    if server is None:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"pg_ctl start failed: {start.stderr[-1000:]} {log[-1000:]}")
    return server


@pytest.fixture(scope="session")
def postgres():
    """A running throwaway PostgreSQL server (stopped and deleted after the session)."""
    server = start_server()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def pg_url(postgres, request) -> str:
    """A fresh database on the session's server; its URL carries the password."""
    name = ("t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:40] + "_"
            + secrets.token_hex(3))
    return postgres.create_database(name)
