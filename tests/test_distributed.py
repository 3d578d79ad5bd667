"""Many processes through Lightning strategies: 2-process DDP on CPU (gloo) stands in for GPUs and nodes."""
import json
import math

import pytest
import torch

from lightning_tfm.training.config.config import TrainConfig
from lightning_tfm.training.data.data import TokenBatchSampler
from lightning_tfm.training.runs.results import read_metrics
from lightning_tfm.training.train import accumulation, world_size

from conftest import ROOT, SMOKE, ltfm

COMMON = ["data.max_train_pairs=400", "data.max_dev_pairs=100", "train.batch_tokens=1024", "train.accelerator=cpu",
          "train.precision=32", "model.dropout=0", "train.record_batches=true", "train.max_steps=12",
          "train.threads=1", "train.val_every_steps=6", "train.log_every_steps=1", "train.checkpoint_every_steps=6"]


def read_batches(run_dir, rank):
    return [json.loads(line) for line in (run_dir / "batches" / f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def ddp_and_single(tmp_path_factory, data_dir):
    runs = {}
    for name, extra in {"ddp": ["train.devices=2", "train.strategy=ddp"],
                        "single": ["train.devices=1", "train.accumulate=2"]}.items():
        results = tmp_path_factory.mktemp(name)
        cache = tmp_path_factory.mktemp(name + "-cache")  # a fresh prepared-corpus cache: built by this run
        p = ltfm("train", SMOKE, f"data.path={data_dir}", f"run.results_dir={results}", f"data.cache_dir={cache}",
                 *COMMON, *extra, env={"WANDB_DIR": str(results)})
        assert p.returncode == 0, p.stderr[-3000:]
        (run_dir,) = [d for d in results.iterdir() if d.is_dir()]
        runs[name] = run_dir
        runs[name + "-stderr"], runs[name + "-cache"] = p.stderr, cache
    return runs


def test_both_ranks_map_one_prepared_corpus(ddp_and_single):
    # the vocabulary and the ids are built once, by the first rank; the second maps the same folder
    assert ddp_and_single["ddp-stderr"].count("training the BPE vocabulary") == 1
    (folder,) = [p for p in ddp_and_single["ddp-cache"].iterdir() if p.is_dir()]
    run = ddp_and_single["ddp"]
    s = json.loads((run / "summary.json").read_text())
    assert s["data_cache"] == str(folder) and folder.name.endswith(s["data_cache_hash"])
    assert (run / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    # the single-process run prepared its own cache from the same data: the same vocabulary
    (other,) = [p for p in ddp_and_single["single-cache"].iterdir() if p.is_dir()]
    assert (other / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()


def test_ranks_see_disjoint_batches_that_together_are_the_epoch(ddp_and_single):
    run = ddp_and_single["ddp"]
    r0, r1 = read_batches(run, 0), read_batches(run, 1)
    assert len(r0) == len(r1) == 12  # one batch per rank per step (no accumulation with 2 processes)
    epoch0 = [[i for b in r if b["epoch"] == 0 for i in b["index"]] for r in (r0, r1)]
    assert set(epoch0[0]).isdisjoint(epoch0[1])
    assert any(b["epoch"] == 1 for b in r0)  # the 12 steps cover a whole first epoch
    assert sorted(epoch0[0] + epoch0[1]) == list(range(400))  # together: every pair once


def test_ddp_matches_one_process_with_accumulation_2(ddp_and_single):
    ddp, single = (read_metrics(ddp_and_single[k]) for k in ("ddp", "single"))
    # the single process saw the same pairs per optimizer step: batches (2k, 2k+1) of the epoch order
    s_batches = read_batches(ddp_and_single["single"], 0)
    d_batches = list(zip(read_batches(ddp_and_single["ddp"], 0), read_batches(ddp_and_single["ddp"], 1)))
    assert [sorted(a["index"] + b["index"]) for a, b in zip(s_batches[0::2], s_batches[1::2])][:6] == \
        [sorted(a["index"] + b["index"]) for a, b in d_batches][:6]
    dev = {k: [r["dev/loss"] for r in m if "dev/loss" in r] for k, m in (("ddp", ddp), ("single", single))}
    assert len(dev["ddp"]) == len(dev["single"]) == 2
    # fp32, no dropout: the same model after 6 and 12 steps, up to summation order (tolerance 1e-4 relative)
    for a, b in zip(dev["ddp"], dev["single"]):
        assert a == pytest.approx(b, rel=1e-4)
    w_ddp = torch.load(ddp_and_single["ddp"] / "checkpoints/last.ckpt", weights_only=True)["state_dict"]
    w_one = torch.load(ddp_and_single["single"] / "checkpoints/last.ckpt", weights_only=True)["state_dict"]
    diff = max((w_ddp[k] - w_one[k]).abs().max().item() for k in w_one)
    assert diff < 1e-4


def test_rank_zero_alone_writes_the_run(ddp_and_single):
    run = ddp_and_single["ddp"]
    summaries = list(run.parent.rglob("summary.json"))
    assert summaries == [run / "summary.json"]
    s = json.loads(summaries[0].read_text())
    assert s["status"] == "completed" and s["world_size"] == 2 and s["accumulate"] == 1
    assert s["effective_batch_tokens"] == 2048
    assert s["steps"] == 12


@pytest.mark.parametrize("total", [4096, 8192, 25000])
def test_world_size_with_a_fixed_effective_batch_keeps_the_optimizer_steps(total):
    lengths = list(range(3, 40)) * 40
    steps = set()
    for world in (1, 2, 4):
        cfg = TrainConfig(batch_tokens=1024, batch_tokens_total=total, accumulate=1)
        acc = accumulation(cfg, world)
        per_rank = len(TokenBatchSampler(lengths, lengths, 1024, num_replicas=world, rank=0))
        steps.add(math.ceil(per_rank / acc))
        assert 1024 * world * acc == pytest.approx(max(total, 1024 * world), rel=0.5)
    assert len(steps) == 1, steps  # 1, 2 or 4 processes: the same optimizer steps per epoch


def test_world_size_from_the_config():
    assert world_size(TrainConfig(devices="2", num_nodes=3, accelerator="cpu")) == 6
    assert world_size(TrainConfig(devices="0,1,2,3", num_nodes=1, accelerator="gpu")) == 4
    assert world_size(TrainConfig(devices="auto", num_nodes=1, accelerator="cpu")) == 1


RNN = ROOT / "experiments" / "multi30k-rnn-smoke.yaml"


def test_an_rnn_under_ddp_trains_as_one_process_with_accumulation_2(tmp_path, data_dir):
    """The recurrent baseline through the same strategy: 2-process DDP (gloo) against one process accumulating
    2 batches, fp32, no dropout. The same dev losses (all-reduced across ranks: the plateau schedule each rank steps
    on them keeps one learning rate) and the same weights after 8 steps; packed sequences and the encoder's
    final-state bridge included."""
    runs = {}
    for name, extra in {"ddp": ["train.devices=2", "train.strategy=ddp"],
                        "single": ["train.devices=1", "train.accumulate=2"]}.items():
        results = tmp_path / name
        p = ltfm("train", RNN, f"data.path={data_dir}", f"run.results_dir={results}",
                 f"data.cache_dir={tmp_path / 'cache'}", *[a for a in COMMON if not a.startswith("model.")],
                 "rnn.dropout=0", "train.max_steps=8", "train.val_every_steps=4", "train.checkpoint_every_steps=4",
                 "train.lr_patience=0", "data.test_split=null", "decode.beam_size=1", *extra,
                 env={"WANDB_DIR": str(results)})
        assert p.returncode == 0, p.stderr[-3000:]
        (runs[name],) = [d for d in results.iterdir() if d.is_dir()]
    s = json.loads((runs["ddp"] / "summary.json").read_text())
    assert s["status"] == "completed" and s["world_size"] == 2 and s["steps"] == 8
    dev = {k: [r["dev/loss"] for r in read_metrics(run) if "dev/loss" in r] for k, run in runs.items()}
    assert len(dev["ddp"]) == len(dev["single"]) == 2
    for a, b in zip(dev["ddp"], dev["single"]):
        assert a == pytest.approx(b, rel=1e-4)
    lrs = {k: [r["train/lr"] for r in read_metrics(run) if "train/lr" in r] for k, run in runs.items()}
    assert lrs["ddp"] == pytest.approx(lrs["single"])
    w = {k: torch.load(run / "checkpoints/last.ckpt", weights_only=True)["state_dict"] for k, run in runs.items()}
    assert max((w["ddp"][k] - w["single"][k]).abs().max().item() for k in w["single"]) < 1e-4


# A tiny model with dropout: what each rank draws is its own
RESUMED = ["data.max_train_pairs=200", "data.max_dev_pairs=10", "data.vocab_size=200", "data.test_split=null",
           "model.layers=1", "model.d_model=16", "model.d_ff=32", "model.heads=2", "model.d_k=8", "model.d_v=8",
           "model.dropout=0.3", "decode.beam_size=1", "decode.max_len_b=5", "train.threads=1", "wandb.mode=disabled",
           "train.batch_tokens=256", "train.val_every_steps=4", "train.checkpoint_every_steps=4", "train.warmup=10",
           "train.accelerator=cpu", "train.precision=32", "train.devices=2", "train.strategy=ddp", "train.max_steps=8"]


@pytest.mark.slow
def test_a_ddp_run_stopped_and_resumed_ends_as_one_never_stopped(tmp_path, data_dir):
    """2-process DDP with dropout, SIGTERM after step 5 or 6 (between step checkpoints), resumed: the weights at step 8
    are those of the run never stopped, to the bit. Each rank draws its own dropout masks, so the checkpoint holds
    every rank's random state and each rank restores its own (it held rank zero's, which every rank restored:
    max |weight difference| 0.005 at the end)."""
    import os
    import subprocess
    import sys

    from conftest import default_signals
    from test_stop_resume import STOPPER

    stopper = tmp_path / "stopper.py"  # a file: Lightning starts the second rank by running the script again
    stopper.write_text(STOPPER)

    def args(name):
        return ["train", SMOKE, f"data.path={data_dir}", f"run.results_dir={tmp_path / name}",
                f"data.cache_dir={tmp_path / 'cache'}", *RESUMED]

    straight = ltfm(*args("straight"), env={"WANDB_MODE": "disabled"})
    assert straight.returncode == 0, straight.stderr[-3000:]
    p = subprocess.run([sys.executable, str(stopper), *map(str, args("stopped"))], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "STOP_AT": "5", "STOP_SIGNAL": "SIGTERM",
                                         "WANDB_MODE": "disabled"}, preexec_fn=default_signals)
    assert p.returncode == 143, p.stderr[-3000:]
    (stopped,) = (tmp_path / "stopped").iterdir()
    at = json.loads((stopped / "summary.json").read_text())["steps"]
    assert 4 < at < 8  # the step under way when the signal came (5 or 6): not a step checkpoint's
    resumed = ltfm(*args("stopped"), env={"WANDB_MODE": "disabled"})
    assert resumed.returncode == 0 and f"from step {at} to 8" in resumed.stderr, resumed.stderr[-3000:]
    (done,) = (tmp_path / "straight").iterdir()
    w = [torch.load(run / "checkpoints/last.ckpt", weights_only=True) for run in (done, stopped)]
    assert w[0]["global_step"] == w[1]["global_step"] == 8
    diff = max((w[0]["state_dict"][k] - w[1]["state_dict"][k]).abs().max().item() for k in w[0]["state_dict"])
    assert diff == 0.0, diff


def test_each_rank_resumes_its_own_random_state_and_an_older_checkpoint_gives_its_one_to_every_rank(tmp_path):
    """The states a checkpoint holds, rank by rank, load back with weights_only=True; a checkpoint of an older version
    (rank zero's state alone, a dict) still resumes, every rank from that state as then; a rank the writing run did
    not have starts from rank zero's."""
    from lightning_tfm.training.runs import upgrade
    from lightning_tfm.training.runs.checkpoint_io import RNG
    from lightning_tfm.training.runs.resume import rank_rng

    states = [{"cpu": torch.get_rng_state()}, {"cpu": torch.Generator().manual_seed(7).get_state()}]
    torch.save({RNG: states}, tmp_path / "new.ckpt")
    ck = torch.load(tmp_path / "new.ckpt", weights_only=True)
    assert [torch.equal(rank_rng(ck, r)["cpu"], states[r]["cpu"]) for r in (0, 1)] == [True, True]
    assert torch.equal(rank_rng(ck, 2)["cpu"], states[0]["cpu"])
    old = upgrade.checkpoint({RNG: states[1]})  # read as today's, as every checkpoint is
    assert rank_rng(old, 0) is rank_rng(old, 1) is states[1]
    assert rank_rng({}, 0) is None
