"""Many workers on one database: Optuna's gRPC storage proxy (``optuna.storages.run_grpc_proxy_server``) in front of
it, and the workers' ``--storage grpc://host:port``.

Each worker on PostgreSQL directly holds its own connections (a pool, the heartbeat's, the queue lock's); a
database's ``max_connections`` (100 by default) bounds the workers. Through the proxy the workers hold one gRPC
channel each, and the database sees the proxy's connections only (``reports/cluster.md`` has both measured).

``ltfm sweep --serve-storage URL [--host H] [--port N]`` runs the proxy (:func:`serve`) in front of ``URL``
(PostgreSQL or MySQL; the password from ``PGPASSWORD``/``~/.pgpass`` as for ``--storage``) until Ctrl-C.

What the proxy's API lacks, and what stands in for it here (:class:`ProxyStorage`):

- **The heartbeat.** A worker's beat is the trial's system attribute :data:`BEAT` (the worker's clock, seconds
  since the epoch), and a trial is stale when its last beat is older than the grace by the clock of the worker
  that looks: the nodes' clocks must agree to well within the grace (NTP does; the grace is a minute or more).
  The stale trials are failed and retried by the same :class:`~.storage.RetryWhileProgressing` as on a database.
- **The queue lock** (a database lock, :func:`~.storage.queue_lock`): not reachable through the proxy, so the
  workers queue and claim without it; a row two workers queue at the same instant is closed as a duplicate,
  untrained (:func:`~.queue.duplicate_of`), as when the lock cannot be had.
"""
from __future__ import annotations

import time

from ..base.errors import UserError

#: The system attribute that holds a trial's last heartbeat through the proxy (seconds since the epoch)
BEAT = "ltfm:heartbeat"
SCHEME = "grpc://"
DEFAULT_PORT = 13000


def refuse_unservable(url: str, shown: str) -> None:
    """``--serve-storage`` names a database, and not SQLite (one line otherwise, before anything is opened)."""
    if url.startswith(SCHEME):
        raise UserError("--serve-storage names the database the proxy serves (postgresql://user@host/db), not a "
                        "proxy")
    if url.startswith("sqlite"):
        raise UserError(f"--serve-storage {shown}: SQLite behind the proxy breaks Optuna's cache (its documentation "
                        "says so): serve PostgreSQL or MySQL")


def parse(url: str) -> tuple[str, int]:
    """``grpc://host:port`` -> (host, port); a one-line UserError otherwise."""
    rest = url[len(SCHEME):].rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"storage URL {url!r}: give the proxy as grpc://host:port (started by `ltfm sweep "
                        "--serve-storage postgresql://... --port N`)")
    return host, int(port)


def _proxy_class():
    import optuna
    from optuna.storages import GrpcStorageProxy
    from optuna.trial import TrialState

    class ProxyStorage(GrpcStorageProxy):
        """Optuna's gRPC client with the heartbeat kept in a system attribute (this module's docstring); its stale
        trials are failed by :func:`fail_stale_trials` (Optuna's heartbeat base class is not public)."""

        def __init__(self, *, host: str, port: int, heartbeat_interval: int | None = None,
                     grace_period: int | None = None, heartbeat_stale_trial_callback=None):
            super().__init__(host=host, port=port)
            self.heartbeat_interval, self.grace_period = heartbeat_interval, grace_period
            self.stale_callback = heartbeat_stale_trial_callback

        def record_heartbeat(self, trial_id: int) -> None:
            self.set_trial_system_attr(trial_id, BEAT, time.time())

        def stale_trial_ids(self, study_id: int) -> list[int]:
            grace = self.grace_period or 2 * (self.heartbeat_interval or 60)
            now = time.time()
            return [t._trial_id for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
                    if isinstance(t.system_attrs.get(BEAT), float) and now - t.system_attrs[BEAT] > grace]

        def get_heartbeat_interval(self) -> int | None:
            return self.heartbeat_interval

        def get_heartbeat_stale_trial_callback(self):
            return self.stale_callback

        def __getstate__(self):
            return {**super().__getstate__(), "heartbeat_interval": self.heartbeat_interval,
                    "grace_period": self.grace_period, "stale_callback": self.stale_callback}

    del optuna
    return ProxyStorage


def fail_stale_trials(study) -> None:
    """Fail the study's stale trials and run their retry callback: Optuna's ``fail_stale_trials`` for a database
    storage; for the proxy, the same steps (the trials whose heartbeat attribute lapsed set FAIL, each one this
    worker failed handed to the stale-trial callback), since Optuna's proxy has no heartbeat of its own."""
    import copy

    import optuna

    storage = study._storage
    if not hasattr(storage, "stale_trial_ids"):
        return optuna.storages.fail_stale_trials(study)
    if storage.get_heartbeat_interval() is None:
        return None
    failed = []
    for trial_id in storage.stale_trial_ids(study._study_id):
        try:
            if storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL):
                failed.append(trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker failed it first
            pass
    callback = storage.get_heartbeat_stale_trial_callback()
    for trial_id in failed if callback is not None else ():
        callback(study, copy.deepcopy(storage.get_trial(trial_id)))
    return None


def open_proxy(url: str, heartbeat: dict | None = None, stale_callback=None, patience: float = 20.0):
    """The storage behind the proxy at ``url`` (``grpc://host:port``), checked to answer within ``patience`` seconds;
    with ``heartbeat`` (a worker's: ``interval``, ``grace``) it keeps the heartbeat as :class:`ProxyStorage` does,
    ``stale_callback`` retrying the trials it finds stale."""
    host, port = parse(url)
    try:
        import grpc  # noqa: F401 - the proxy's transport
    except ImportError:
        raise UserError(f"storage {url}: the gRPC proxy needs grpcio: pip install 'lightning_tfm[slurm]'") from None
    kwargs = {}
    if heartbeat:
        kwargs = {"heartbeat_interval": heartbeat["interval"], "grace_period": heartbeat["grace"],
                  "heartbeat_stale_trial_callback": stale_callback}
    import warnings

    import optuna

    with warnings.catch_warnings():  # experimental since Optuna 4.2: said once in the README, not at every open
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = _proxy_class()(host=host, port=port, **kwargs)
    try:
        storage.wait_server_ready(timeout=patience)
    except ConnectionError:
        raise UserError(f"no storage proxy answers at {url} within {patience:.0f} s: start it with `ltfm sweep "
                        f"--serve-storage postgresql://... --host {host} --port {port}`, or check host and port"
                        ) from None
    return storage


def transient_errors() -> tuple[type[BaseException], ...]:
    """The errors of a proxy that restarts or is briefly unreachable (retried like a database's)."""
    try:
        import grpc
    except ImportError:
        return ()
    return (grpc.RpcError,)


def serve(rdb, shown: str, host: str, port: int, say=None) -> int:
    """Run the proxy in front of the database storage ``rdb`` (an ``RDBStorage``; ``shown``: its URL, password
    masked) on ``host:port`` until Ctrl-C (or SIGTERM)."""
    import signal

    import optuna
    from optuna.storages import get_storage, run_grpc_proxy_server

    storage = get_storage(rdb)  # Optuna's cache in front of an RDBStorage: the proxy's documented setup
    say = say or (lambda msg: print(msg, flush=True))  # its first line read through a pipe: at once
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    say(f"ltfm: storage proxy for {shown} on grpc://{host}:{port} (workers: --storage grpc://{host}:{port}); "
        "Ctrl-C stops it")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        run_grpc_proxy_server(storage, host=host, port=port)
    except KeyboardInterrupt:
        say("ltfm: storage proxy stopped")
        return 130
    except RuntimeError as e:  # the port taken
        raise UserError(f"cannot serve on {host}:{port} ({e}): choose another --port") from None
    return 0
