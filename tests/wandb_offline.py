"""The tests' name for the reader of offline W&B runs, :mod:`lightning_tfm.training.tracking.wandb_files` (no mocking of
wandb: the tests read the files a real offline run wrote)."""
from lightning_tfm.training.tracking.wandb_files import (  # noqa: F401 - re-exported for the tests
    OfflineRun,
    WandbFileError,
    find_run_files,
    merge,
    read_records,
    read_run,
    read_runs,
)
