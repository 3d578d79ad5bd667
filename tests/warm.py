"""Warm starts for the tests' CLI processes: ``python -m lightning_tfm ...`` forked from a process that has already
imported torch, Lightning and the other heavy libraries, instead of started cold.

Why: a cold ``ltfm`` pays its imports every time (``python -c "import pytorch_lightning"`` alone takes 8.7 s on
the EPYC AVX2, reports/timing.md), and the suite starts about a hundred of them through conftest's ``ltfm``. A
warm-started command is still a process of its own: its own pid, standard streams (files the test reads back),
environment, working folder, signals at their defaults, exit code, atexit handlers and interpreter shutdown, run
by ``runpy`` exactly as ``python -m lightning_tfm`` runs it. What it shares with the server is what the server
imported, so:

- the server imports third-party libraries and ``lightning_tfm.cli`` only (whose commands import lazily), so each
  command still imports the package's own modules and ``wandb`` / ``datasets`` where it uses them;
- it serves only while it has one thread (checked after its imports): forking a multi-threaded process is
  unsafe, and the tests then start every command cold;
- a command whose environment differs from the server's in a variable read at import time
  (:data:`IMPORT_TIME_ENV`: thread counts, paths, ``HOME``) is started cold, as is any ``ltfm(..., fresh=True)``
  and every command when ``LTFM_TEST_FRESH=1``.

Two kinds of process go through it:

- the commands a test starts through conftest's ``ltfm``;
- the processes such a command starts as ``python -m lightning_tfm train ...`` (a sweep's trials) or
  ``python -m ipykernel_launcher ...`` (a report's notebook kernel), when the command is a ``sweep`` or a ``report``
  the server forked: ``warmsite/sitecustomize.py`` (on every test process's ``PYTHONPATH``) turns such a process,
  right after its interpreter starts, into a client that hands its standard streams, environment, folder and
  arguments to the server and stands in for the command: it forwards the signals it gets to it and ends with its exit
  code (or the signal that ended it); a client that dies (a worker's ``PR_SET_PDEATHSIG``, a ``SIGKILL``) takes
  its command with it. The command has a pid of its own, as any process a launcher starts (a sweep worker tells
  its trial's summary by the token it gives the trial, ``ATTEMPT_ENV``, not by the pid).

Not :mod:`multiprocessing`'s forkserver: its children end with ``os._exit`` (no atexit handlers, as a real
command has) and have their standard input replaced, and a command must run as ``__main__``.

The protocol: the client connects to the server's Unix socket and sends one byte with the command's three file
descriptors (stdin, stdout, stderr), then the request as JSON after its length (8 bytes). The server forks a
*manager* per request; the manager answers ``cold`` (the environment differs in :data:`IMPORT_TIME_ENV`: the client
starts the command cold) or forks the command and sends its pid (a line), waits for it and sends its exit code as
``subprocess`` gives it (negative for a signal); if the client's end closes first, it kills the command.
"""
from __future__ import annotations

import atexit
import importlib
import io
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# What the server imports before it forks: the libraries every command pays for (torch and Lightning, which pulls
# in torchmetrics), those of the sweep and report commands, and the CLI itself.
# Not pandas: it imports pyarrow, whose allocator starts a thread (jemalloc_bg_thd), and a process with two threads
# is not forked.
# The notebook kernel's own (ipykernel, IPython, pyplot) for the kernels a report starts. Not papermill, whose imports
# start a thread either.
PRELOAD = ("torch", "pytorch_lightning", "optuna", "sqlalchemy", "numpy", "scipy.optimize", "scipy.stats",
           "matplotlib.figure", "matplotlib.pyplot", "yaml", "sacrebleu", "tokenizers", "ipykernel.kernelapp",
           "lightning_tfm.cli")
# The commands whose own processes (trials, kernels) are warm-started too (``warmsite/sitecustomize.py``): the server's
# socket in this variable of their environment.
SOCKET_ENV = "LTFM_TEST_WARM_SOCKET"
CHILD_COMMANDS = ("sweep", "report")
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warmsite")
_LENGTH = struct.Struct("!Q")

# Variables a library reads while it is imported (thread pools, search paths, config folders): a command that sets
# one differently from the server is started cold.
IMPORT_TIME_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONPATH", "PYTHONHASHSEED",
                   "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "MPLBACKEND", "MPLCONFIGDIR", "CUDA_VISIBLE_DEVICES",
                   "TORCH_LOGS", "TORCHDYNAMO_DISABLE", "LD_PRELOAD", "LD_LIBRARY_PATH")


# ---------------------------------------------------------------------------------------------------------------
# the server (its own process: ``python tests/warm.py SOCKET``)

def _serve(path: str) -> dict | None:
    """Import, listen, and fork a manager per request. Returns only in a command process, with its request."""
    for name in PRELOAD:
        importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        print(f"unsafe: {threads} threads after the imports", flush=True)
        return None
    import gc

    gc.collect()
    gc.freeze()  # the imported objects out of the collector's reach: a command's collections do not copy their pages
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # managers are reaped by the kernel
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([server, sys.stdin], [], [])
        if sys.stdin in ready:  # the client's end of our stdin closed: its process is gone
            os._exit(0)
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the manager waits for its command
            request = _manage(conn)
            request["socket"] = path
            return request
        conn.close()


def _receive(conn: socket.socket) -> tuple[list[int], dict]:
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    data = b""
    while len(data) < _LENGTH.size or len(data) < _LENGTH.size + _LENGTH.unpack(data[:_LENGTH.size])[0]:
        chunk = conn.recv(1 << 16)
        if not chunk:
            os._exit(0)  # the client went away before its request was whole
        data += chunk
    return fds, json.loads(data[_LENGTH.size:])


def _manage(conn: socket.socket) -> dict:
    """In a manager: fork the command (which returns with its request) and report its pid and exit code."""
    fds, request = _receive(conn)
    env = request["env"]
    if any(env.get(k) != SERVER_ENV.get(k) for k in IMPORT_TIME_ENV):
        conn.sendall(b"cold\n")
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        return request
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"{pid}\n".encode())
        done = os.pidfd_open(pid)
        while True:
            ready, _, _ = select.select([done, conn], [], [])
            if done in ready:
                break
            if not conn.recv(1):  # the client is gone (killed, or its caller died): so is its command
                os.kill(pid, signal.SIGKILL)
                break
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    finally:
        os._exit(0)


def _run_command(request: dict) -> None:
    """In the command process: become ``python -m MODULE ARGS`` started in ``cwd`` with ``env``."""
    os.environ.clear()
    os.environ.update(request["env"])
    if request["args"][:1] and request["args"][0] in CHILD_COMMANDS and request.get("module") is None:
        os.environ[SOCKET_ENV] = request["socket"]  # its trials or kernel are warm-started too
    os.chdir(request["cwd"])
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in request.get("ignored", ()):  # ignored in the client: a new interpreter keeps them ignored
        signal.signal(s, signal.SIG_IGN)
    sys.path[0] = os.getcwd()  # what ``python -m`` puts first
    sys.argv = ["-m", *request["args"]]
    import runpy

    runpy.run_module(request.get("module") or "lightning_tfm", run_name="__main__", alter_sys=True)
    sys.exit(0)  # a __main__ that returns: exit code 0, as ``python -m`` gives


def request_bytes(request: dict) -> bytes:
    data = json.dumps(request).encode()
    return _LENGTH.pack(len(data)) + data


# ---------------------------------------------------------------------------------------------------------------
# the client (in the pytest process)

class WarmStarter:
    """One server per pytest process, started on first use; ``run`` is ``subprocess.run``'s contract for
    ``python -m lightning_tfm ARGS`` with ``capture_output=True, text=True``."""

    def __init__(self, cwd: Path):
        self.folder = tempfile.mkdtemp(prefix="ltfm-warm-")
        self.path = os.path.join(self.folder, "socket")
        self.env = SERVER_ENV
        log = open(os.path.join(self.folder, "server.log"), "wb")
        # stdin: a pipe this process never writes to, whose end tells the server to stop when this process is gone
        # PYTHONUNBUFFERED: the standard streams a command inherits write through, as a trial's must (its worker
        # sets the variable: the trial's log is read while it runs); a cold command's only flush later
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=log, cwd=cwd,
                                     env={**ENVIRON, "PYTHONUNBUFFERED": "1"},
                                     preexec_fn=default_signals)
        log.close()
        self.state = self.proc.stdout.readline().decode().strip()  # "ready", or why not
        atexit.register(self.close)

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self.proc.poll() is None

    def serves(self, env: dict) -> bool:
        return self.ready and all(env.get(k) == v for k, v in self.env.items())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, args: list[str], env: dict, input: str | None, timeout: float | None, cwd) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "lightning_tfm", *args]
        with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            stdin.write((input or "").encode())
            stdin.seek(0)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(self.path)
                socket.send_fds(conn, [b"F"], [stdin.fileno(), out.fileno(), err.fileno()])
                conn.sendall(request_bytes({"args": args, "env": env, "cwd": str(cwd)}))
                replies = conn.makefile("r")
                pid = int(replies.readline())  # (never "cold": `serves` checked the environment)
                conn.settimeout(timeout)
                try:
                    code = int(replies.readline())
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(cmd, timeout, _text(out), _text(err)) from None
            return subprocess.CompletedProcess(cmd, code, _text(out), _text(err))


def _text(f) -> str:
    """A captured stream as ``text=True`` reads it (universal newlines)."""
    f.seek(0)
    return io.TextIOWrapper(io.BytesIO(f.read())).read()


def default_signals() -> None:
    """A child's ``preexec_fn``: SIGINT, SIGHUP and SIGTERM as a terminal delivers them (their default action), so a
    test that signals a command tests its handlers even when the suite itself runs with them ignored (``nohup``,
    a background job of a non-interactive shell: the command then keeps them ignored, as it should)."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


_starter: tuple[int, WarmStarter] | None = None
# Every process the tests start finds warmsite/sitecustomize.py (inert unless SOCKET_ENV names a server)
if SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, os.environ.get("PYTHONPATH")) if p)
# The environment the server starts in: the test session's, as it was before any test changed it (monkeypatch)
ENVIRON = dict(os.environ)
SERVER_ENV = {k: ENVIRON.get(k) for k in IMPORT_TIME_ENV}


def starter(cwd: Path) -> WarmStarter | None:
    """This process's server (started on first call), or None when commands start cold (``LTFM_TEST_FRESH=1``,
    or the server found itself unsafe to fork)."""
    global _starter
    if os.environ.get("LTFM_TEST_FRESH") == "1":
        return None
    if _starter is None or _starter[0] != os.getpid():
        _starter = (os.getpid(), WarmStarter(cwd))
        if not _starter[1].ready:
            print(f"tests/warm.py: commands start cold ({_starter[1].state or 'the server did not start'})",
                  file=sys.stderr)
    return _starter[1] if _starter[1].ready else None


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # import lightning_tfm as ``python -m`` from this folder would
    request = _serve(sys.argv[1])
    if request is not None:
        _run_command(request)
