# make ablation : set up .venv and run the main job: Table 3 (sweeps/table3-cpu.yaml) on Multi30k at CPU
#                 scale with a ~20-minute budget on 2 cores (2 workers sharing one Optuna study), then its report (reports/build/<sweep>/)
#   FULL=1      : the full CPU budget (the experiment's train.max_steps per row, hours)
#   SWEEP=sweeps/table3.yaml FULL=1 ARGS="train.devices=8 train.strategy=ddp" : the paper's scale on a GPU node
# make test     : set up .venv and run the test suite (what CI runs)
# make test-fast: the suite without the slow end-to-end tests (development)
# DATA=folder   : read {split}.{lang}[.gz] files from a local folder instead of the Hugging Face Hub.
#                 Default: ../shared/data/multi30k when it exists (offline machines), else the Hub.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
SHARED_DATA := $(wildcard ../shared/data/multi30k/train.en.gz)
DATA ?= $(if $(SHARED_DATA),../shared/data/multi30k,)
ifeq ($(strip $(DATA)),)
DATA_ARGS := data.source=hub data.hub_name=bentrevett/multi30k data.dev_split=validation data.test_split=test
else
DATA_ARGS := data.source=local data.path=$(abspath $(DATA))
endif
EXPERIMENT ?= experiments/multi30k-smoke.yaml
SWEEP ?= sweeps/table3-cpu.yaml
WORKERS ?= 2
ARGS ?=
# The quick budget (66 min on an AVX2-only 2-core CPU in fp32; a pipeline check): every row trains QUICK_STEPS steps of small batches (big: 3x), dev BLEU on 300 sentences.
QUICK_STEPS ?= 80
QUICK := train.max_steps=$(QUICK_STEPS) train.warmup=$(shell echo $$(( $(QUICK_STEPS) / 2 ))) train.batch_tokens=1500 \
	train.val_every_steps=$(shell echo $$(( $(QUICK_STEPS) / 2 ))) train.checkpoint_every_steps=$(QUICK_STEPS) \
	data.max_dev_pairs=300 train.threads=1
BUDGET := $(if $(FULL),,$(QUICK))

.PHONY: setup ablation test test-fast train clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: an open range would pull a multi-GB CUDA build on a machine without torch.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

ablation: setup
	@echo "ltfm: $(SWEEP) with $(WORKERS) workers ($(if $(FULL),full budget,quick budget: $(QUICK_STEPS) steps per row; FULL=1 for the full one))"
	@trap 'kill 0' INT TERM; pids=; for i in $$(seq $(WORKERS)); do \
	  $(VENV)/bin/ltfm sweep $(SWEEP) $(DATA_ARGS) $(BUDGET) $(ARGS) & pids="$$pids $$!"; sleep 2; done; \
	  rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	  [ $$rc = 0 ] || echo "ltfm: some trials failed (ltfm sweep $(SWEEP) --status); ltfm runs shows them"
	$(VENV)/bin/ltfm sweep $(SWEEP) --status $(DATA_ARGS) $(BUDGET) $(ARGS)
	$(VENV)/bin/ltfm runs results
	$(VENV)/bin/ltfm report $(SWEEP)

train: setup
	$(VENV)/bin/ltfm train $(EXPERIMENT) $(DATA_ARGS) $(ARGS)

# Two pytest workers (pytest-xdist), a test file each at a time: the end-to-end tests are mostly one-core
# subprocesses, so two cores run the suite in ~11 minutes instead of ~14 (TEST_WORKERS=0: one process).
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# the suite without the tests that train through subprocesses (marked slow): a few minutes, for development
test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf results reports/build wandb
