"""Run at the start of every Python process the tests start (tests/warm.py puts this folder on ``PYTHONPATH``).

Inert unless the process is a trial (``python -m lightning_tfm train ...``) or a notebook kernel
(``python -m ipykernel_launcher ...``) started by a command that tests/warm.py's server forked (its socket in
``LTFM_TEST_WARM_SOCKET``): then this process hands its standard streams, environment, folder and arguments to the
server, which forks the command from its imported libraries, and stands in for it until it ends (tests/warm.py's
docstring). If the server cannot be reached or declines (``cold``), the process goes on as it was started.
"""
import os
import sys


def _stand_in(path: str, module: str, args: list) -> None:
    import signal
    import socket

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        from warm import request_bytes  # the protocol's one home
    finally:
        del sys.path[0]

    ignored = [int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if signal.getsignal(s) == signal.SIG_IGN]
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        socket.send_fds(conn, [b"F"], [0, 1, 2])
        conn.sendall(request_bytes({"module": module, "args": args, "env": dict(os.environ), "cwd": os.getcwd(),
                                    "ignored": ignored}))
        replies = conn.makefile("r")
        first = replies.readline().strip()
    except OSError:
        return  # no server (the test session is over): started cold
    if not first.isdigit():
        conn.close()
        return  # "cold": an environment the server cannot give
    pid = int(first)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        if int(s) not in ignored:
            signal.signal(s, forward)
    line = replies.readline().strip()
    code = int(line) if line.lstrip("-").isdigit() else 1
    sys.stdout.flush()
    if code < 0:  # ended by a signal: so is this process, as its caller expects
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def _main() -> None:
    path = os.environ.get("LTFM_TEST_WARM_SOCKET")
    argv = getattr(sys, "orig_argv", [])
    if not path or len(argv) < 3 or argv[1] != "-m":
        return
    module, args = argv[2], argv[3:]
    if (module == "lightning_tfm" and args[:1] == ["train"]) or module == "ipykernel_launcher":
        _stand_in(path, module, args)


_main()
