"""``ltfm bench``: training and decoding speed (ours against MarianMTModel), the data pipeline at scale, the paper's
Table 1 layers (``--layers``)."""
from __future__ import annotations

import argparse

from ..base.command import Command, say_done
from ..base.errors import UserError


def _bench_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--config", metavar="CONFIG.yaml", help="take the model's shapes from an experiment")
    b.add_argument("--vs", choices=["marian", "none"], default="none", help="also measure Hugging Face's "
                   "MarianMTModel at the same shapes (pip install -e '.[bench]', or make bench)")
    b.add_argument("--json", action="store_true", help="JSON instead of a table")
    b.add_argument("--dtypes",
                   help="comma-separated, from fp32,bf16 (default: fp32, plus bf16 where the device has it)")
    b.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where both models run (auto: cuda when torch sees a GPU, else cpu)")
    b.add_argument("--data", type=int, metavar="N", help="instead: benchmark the data pipeline on a generated "
                   "corpus of N pairs (prepare time, second trial's time to its first step, RSS, cache size)")
    b.add_argument("--profile", action="store_true", help="instead: where a trial of the --config experiment "
                   "spends its time (a real run of its steps, 300 unless train.max_steps is given: start-up, steps, "
                   "validation, the closing BLEU; the step by kind of work under torch.profiler)")
    b.add_argument("--layers", action="store_true", help="instead: the paper's Table 1 measured: one "
                   "self-attention, GRU, LSTM and convolutional layer timed over sentence lengths (forward + "
                   "backward, one decoding step), with fitted slopes, a table and a figure")
    b.add_argument("--d-model", metavar="D,D", help="with --layers: comma-separated widths (default 128,256)")
    b.add_argument("--lengths", metavar="N,N,...", help="with --layers: comma-separated sentence lengths "
                   "(default 8,16,32,64,128,256)")
    b.add_argument("--attention-kernel", choices=["matmul", "sdpa", "auto"], help="with --layers: how the "
                   "self-attention computes Eq. 1 at every length (default matmul; model.attention_kernel)")
    b.add_argument("--out", metavar="DIR", help="with --layers: folder for layers.json, .csv, .png and .svg "
                   "(default results/bench-layers)")
    b.add_argument("overrides", nargs="*", help="bench.KEY=N shapes (bench.batch=256, bench.d_model=512, ...) "
                   "and, with --config, config overrides; with --layers bench.batch, heads, kernel_width, "
                   "threads, run_ms, reps")


def bench_cli(args) -> int:
    """``ltfm bench``: training and decoding speed (:mod:`.speed`); with ``--data N``, the data pipeline's
    instead (:mod:`.pipeline`); with ``--layers``, one layer of each type over sentence lengths, the paper's
    Table 1 (:mod:`.layers`)."""
    layer_options = [o for o, v in (("--d-model", args.d_model), ("--lengths", args.lengths), ("--out", args.out),
                                    ("--attention-kernel", args.attention_kernel)) if v is not None]
    if args.layers:
        from ..bench.layers import DEFAULT_OUT, bench_layers_cli, check_out_dir
        from .common import check_outputs
        out = check_out_dir(args.out or DEFAULT_OUT)  # a folder first; then none of its files a run's or an export
        check_outputs([out / f"layers.{ext}" for ext in ("json", "csv", "png", "svg")])
        code = bench_layers_cli(args)
        if code == 0:
            say_done(f"{args.out or DEFAULT_OUT}/ (layers.json, .csv, .png, .svg)",
                     "compare with the committed measurement, reports/table1.md")
        return code
    if layer_options:
        raise UserError(f"{layer_options[0]} goes with --layers: add --layers, or leave it out")
    if args.profile:
        from ..bench.profile import bench_profile_cli
        return bench_profile_cli(args)
    if args.data is not None:
        from ..bench.pipeline import bench_data_cli
        return bench_data_cli(args)
    from ..bench.speed import bench_speed_cli
    return bench_speed_cli(args)


BENCH = Command("bench", "training and decoding speed, ours against MarianMTModel (--layers: Table 1's layers)",
                _bench_arguments, bench_cli)
