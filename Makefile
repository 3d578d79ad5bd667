# make ablation : set up .venv and run the main job, Table 3, then its report (reports/build/<sweep>/):
#                 on CPU the protocol sweeps/table3-cpu.yaml (Multi30k, d_model 128, 600 steps a row, the base at
#                 3 seeds, a worker per core: its time on 2 cores is in reports/reference/README.md); with a
#                 CUDA GPU the GPU protocol, sweeps/table3-gpu.yaml (d_model 256, 4 workers on each GPU). One
#                 progress line every 30 s.
#                 Then it settles the rows (ltfm sweep --settle): another seed of a row, more of the base or a longer
#                 budget until each row is better, worse or the same as the base within ±delta, or at the cap the
#                 sweep file's settle: section sets (sweeps/table3-cpu.yaml: at most 3 seeds a row; replayed on the
#                 committed exports, 1.77x the first pass's training FLOPs); a sweep file without settle: runs its
#                 first pass alone.
#   SETTLE=0    : the first pass alone (no settling)
#   QUICK=1     : a pipeline check in a few minutes (every row of the protocol, QUICK_STEPS steps, 100 dev pairs;
#                 it settles too, at QUICK_SETTLE's cap: 2 seeds a row)
#   WORKERS=K   : K workers instead of one per core (or GPU)
#   SWEEP=sweeps/table3.yaml ARGS="train.devices=8 train.strategy=ddp" WORKERS=1 : the paper's scale on a GPU node
# make reference: make ablation, then its report with provenance in reports/reference/<sweep name>/; stopped
#                 (Ctrl-C), it goes on when run again, or on another machine: make reference-carry packs it
# make test     : set up .venv and run the test suite (what CI runs), make lint first
# make lint     : ruff's check of lightning_tfm and tests (pyproject.toml's [tool.ruff]: pycodestyle, pyflakes, isort)
# make test-long: the long end-to-end tests make test leaves out (several sweeps each)
# make test-fast: the suite without the slow end-to-end tests (development)
# make bench    : the comparison with Hugging Face's MarianMTModel: installs the bench extra (transformers, which the
#                 test environment leaves out), runs the tests marked marian, then ltfm bench --vs marian
# make pages    : the reference pages' HTML (not committed), built beside each page's markdown from its export
# make soak     : a sweep through a bad night (chaos: kills, stops, a full disk, a database restart), then its invariants
# make slurm-up : a throwaway one-node Slurm cluster on loopback (SLURM_DIR; prints its SLURM_CONF); make slurm-down
# DATA=folder   : read {split}.{lang}[.gz] files from a local folder instead of the Hugging Face Hub.
#                 Default: ../shared/data/multi30k when it exists (offline machines; the ltfm commands' default
#                 too), else the Hub.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# data.path's default: the ltfm commands' own (DEFAULT_DATA in lightning_tfm/cli/common.py, read from there)
DEFAULT_DATA := $(shell sed -n 's/^DEFAULT_DATA = "\(.*\)"$$/\1/p' lightning_tfm/cli/common.py)
SHARED_DATA := $(wildcard $(DEFAULT_DATA)/train.en.gz)
DATA ?= $(if $(SHARED_DATA),$(DEFAULT_DATA),)
ifeq ($(strip $(DATA)),)
DATA_ARGS := data.source=hub data.hub_name=bentrevett/multi30k data.dev_split=validation data.test_split=test
else
DATA_ARGS := data.source=local data.path=$(abspath $(DATA))
endif
EXPERIMENT ?= experiments/multi30k-smoke.yaml
# CUDA present (asked of the environment's torch once it is installed): the full Multi30k budget on the GPUs
HAS_CUDA = $(shell $(PY) -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)
SWEEP ?= $(if $(filter 1,$(HAS_CUDA)),sweeps/table3-gpu.yaml,sweeps/table3-cpu.yaml)
WORKERS ?= auto
ARGS ?=
# QUICK=1: the pipeline in a few minutes (every row QUICK_STEPS steps, big 3x; 100 dev pairs). Its numbers say nothing:
# its runs are tagged pipeline-check, which puts them in W&B group <sweep>-pipeline-check and its report run under an
# id of its own (never the real sweep's), and its report's title says so.
QUICK_STEPS ?= 20
QUICK_ARGS := train.max_steps=$(QUICK_STEPS) train.warmup=$(QUICK_STEPS) train.val_every_steps=$(QUICK_STEPS) \
	train.checkpoint_every_steps=$(QUICK_STEPS) data.max_dev_pairs=100 decode.max_len_b=10 'wandb.tags=[pipeline-check]'
BUDGET = $(if $(QUICK),$(QUICK_ARGS),)
# The settle loop: on when the sweep file has a settle: section (SETTLE=0: off); QUICK=1 settles at a cap of its own
# (2 seeds a row, the base's three: the path exercised, its answers say nothing)
SETTLE ?= $(if $(shell grep -qs '^settle:' $(SWEEP) && echo 1),1,0)
QUICK_SETTLE := settle.seeds=2 settle.base_seeds=3 settle.budget=1
SETTLE_ARGS = $(if $(filter 1,$(SETTLE)),--settle $(if $(QUICK),$(QUICK_SETTLE),),)
# QUICK runs keep their own results (a different corpus and budget): never mixed into the protocol's table
RESULTS_ARGS = $(if $(QUICK),run.results_dir=results-quick,)

.PHONY: setup ablation reference reference-carry test test-long test-fast bench train clean gpu-check gpu-prep soak heldout rerender \
	pages slurm-up slurm-down

# A CUDA build of torch (>= 2.4) already in $(PYTHON), as on a GPU box, is used as it is: the venv sees the
# system's packages and pip installs no torch over it. Elsewhere torch is installed first, pinned: an open range
# would pull a multi-GB CUDA build on a machine without torch.
SYSTEM_CUDA_TORCH = $(shell $(PYTHON) -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 4) and torch.version.cuda else 1)' >/dev/null 2>&1 && echo 1)

# Each step says what it does before it starts (the whole setup takes minutes, pip -q says nothing meanwhile).
$(VENV)/.installed: pyproject.toml
	@echo "setup 1/3: creating the virtual environment $(VENV) ($(PYTHON) -m venv, seconds)"
	$(PYTHON) -m venv $(if $(SYSTEM_CUDA_TORCH),--system-site-packages,) $(VENV)
	@echo "setup 2/3: $(if $(SYSTEM_CUDA_TORCH),using the CUDA torch of $(PYTHON) (no torch installed),installing \
	torch 2.13.0: the largest download (~1-4 min; pip shows its progress))"
	$(if $(SYSTEM_CUDA_TORCH),,$(PY) -m pip install torch==2.13.0)
	@echo "setup 3/3: installing lightning_tfm and its dependencies (Lightning, Optuna, W&B, Jupyter, ...: ~1-3 min)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@
	@echo "setup: done: $(VENV) (then: source $(VENV)/bin/activate)"

setup: $(VENV)/.installed

# the bench extra on top of setup (make bench, make gpu-check)
$(VENV)/.bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

# the sweep's exit 130 is Ctrl-C (its stopped trials resume first when this runs again); another non-zero, a failed trial
ablation: setup
	$(VENV)/bin/ltfm sweep $(SWEEP) --workers $(WORKERS) $(SETTLE_ARGS) $(DATA_ARGS) $(RESULTS_ARGS) $(BUDGET) $(ARGS); rc=$$?; \
	if [ $$rc -eq 130 ]; then echo "ltfm: the sweep was stopped; make ablation$(if $(QUICK), QUICK=1,) again resumes it"; exit 130; fi; \
	if [ $$rc -ne 0 ]; then echo "ltfm: some trials failed ($(VENV)/bin/ltfm sweep $(SWEEP) --status $(RESULTS_ARGS)); $(VENV)/bin/ltfm runs $(if $(QUICK),results-quick,results) shows them"; fi
	$(VENV)/bin/ltfm sweep $(SWEEP) --status $(DATA_ARGS) $(RESULTS_ARGS) $(BUDGET) $(if $(QUICK),$(QUICK_SETTLE),) $(ARGS)
	$(VENV)/bin/ltfm runs $(if $(QUICK),results-quick,results)
	$(VENV)/bin/ltfm report $(SWEEP) $(if $(QUICK),--results results-quick --out reports/build/quick-$(notdir $(basename $(SWEEP))),$(if $(REPORT_RESULTS),--results $(REPORT_RESULTS),))

# make reference: `make ablation` (same variables), then its report copied to reports/reference/<sweep name>/ with
# provenance.txt (command, commit, machine, start date, wall time) and status.txt (every row's state and duration)
REF_NAME = $(notdir $(basename $(SWEEP)))
REF_RESULTS = $(if $(QUICK),results-quick,results)
STUDY = $(shell sed -n 's/^name: *\([^ #]*\).*/\1/p' $(SWEEP) | head -1)
CARRY = reports/reference/$(REF_NAME)$(if $(QUICK),-quick,)-carry.tar.gz
# not spelled $(MAKE) in the recipe: make runs a recipe line naming it even under `make -n`, and this one
# replaces reports/reference/<sweep>/
SUBMAKE = $(MAKE)
reference: setup
	@set -e; if [ -f $(CARRY) ] && [ ! -e $(REF_RESULTS)/$(STUDY).db ]; then \
	  bash reports/reference/carry.sh restore $(CARRY) $(REF_RESULTS) $(STUDY); fi; \
	t0=$$(date +%s); commit=$$(git rev-parse HEAD 2>/dev/null || echo unknown); \
	dirty=$$(git status --porcelain --untracked-files=no -- . ':!reports/reference' 2>/dev/null | head -1); \
	segment="bash reports/reference/carry.sh segment $(REF_RESULTS) $(STUDY) $$t0"; \
	trap '$$segment $$(date +%s) $$commit$${dirty:++}' EXIT; \
	rc=0; $(SUBMAKE) --no-print-directory ablation SWEEP=$(SWEEP) WORKERS=$(WORKERS) ARGS='$(ARGS)' $(if $(QUICK),QUICK=1,) || rc=$$?; \
	if [ $$rc -ne 0 ]; then echo "ltfm: the reference stopped: make reference$(if $(QUICK), QUICK=1,) goes on here; make reference-carry$(if $(QUICK), QUICK=1,) packs it for another machine"; exit $$rc; fi; \
	trap - EXIT; $$segment $$(date +%s) $$commit$${dirty:++}; \
	out=reports/reference/$(REF_NAME)$(if $(QUICK),-quick,); segments=$(REF_RESULTS)/$(STUDY).segments; \
	build=reports/build/$(if $(QUICK),quick-,)$(REF_NAME); rm -rf $$out; mkdir -p $$out; \
	cp $$build/*.md $$build/*.csv $$build/*.html $$build/*.png $$out/; cp $$build/*.tex $$out/ 2>/dev/null || true; \
	if [ -d $$build/export ]; then cp -r $$build/export $$out/; fi; \
	$(VENV)/bin/ltfm sweep $(SWEEP) --status $(DATA_ARGS) $(RESULTS_ARGS) $(BUDGET) $(if $(QUICK),$(QUICK_SETTLE),) $(ARGS) > $$out/status.txt; \
	w=$$(bash reports/reference/carry.sh wall $(REF_RESULTS) $(STUDY)); n=$$(wc -l < $$segments); \
	commits=$$(awk '{ print $$3 }' $$segments | uniq | tr '\n' ' ' | sed 's/ $$//; s/+/ (with uncommitted changes)/g'); \
	{ echo "command: make reference$(if $(QUICK), QUICK=1,)$(if $(filter-out auto,$(WORKERS)), WORKERS=$(WORKERS),)$(if $(ARGS), ARGS='$(ARGS)',)"; \
	  echo "sweep: $(SWEEP)"; echo "commit: $$commits"; \
	  echo "machine: $$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1) (family $$(lscpu | sed -n 's/^CPU family: *//p' | head -1), model $$(lscpu | sed -n 's/^Model: *//p' | head -1); $$(grep -o -w -m1 'avx512_bf16' /proc/cpuinfo || echo 'no avx512_bf16'), $$(grep -o -w -m1 'avx2' /proc/cpuinfo || echo 'no avx2')), $$(nproc) cores, $$(free -g | awk '/Mem:/{print $$2}') GiB, torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	  echo "started: $$(date -u -d @$$(head -1 $$segments | cut -d' ' -f1) +%Y-%m-%dT%H:%M:%SZ)"; \
	  echo "wall time (setup checked, sweep, report): $$((w / 3600))h $$((w % 3600 / 60))m $$((w % 60))s$$( [ $$n -gt 1 ] && echo " in $$n sessions (make reference-carry between them)")"; } > $$out/provenance.txt; \
	if [ -f $(CARRY) ]; then rm -f $(CARRY); echo "ltfm: the reference is complete: its carry $(CARRY) is removed (commit that)"; fi; \
	cat $$out/provenance.txt; echo "reference report: $$out/"

# make reference-carry: a stopped make reference packed for another machine (reports/reference/carry.sh), to commit:
# the study and its completed runs without checkpoints; make reference on a fresh clone goes on from it
reference-carry: setup
	@bash reports/reference/carry.sh save $(CARRY) $(REF_RESULTS) $(STUDY)

train: setup
	$(VENV)/bin/ltfm train $(EXPERIMENT) $(DATA_ARGS) $(ARGS)

# Two pytest workers (pytest-xdist), a test file each at a time (TEST_WORKERS=0: one process). With two workers
# every process gets one thread (OMP_NUM_THREADS=1): two trainings at 2 threads each on 2 cores oversubscribe
# them (reports/timing.md, "The test suite", has the measurement). The files go to the workers in collection order,
# the longest first (LONGEST_FIRST in tests/conftest.py): --no-loadscope-reorder keeps pytest-xdist (3.x) from
# reordering them by their number of tests, which put test_sweep.py, the longest, last.
TEST_WORKERS ?= 2
PYTEST = $(if $(filter 0,$(TEST_WORKERS)),,OMP_NUM_THREADS=1 )$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
# ruff at 120 columns (pyproject.toml's [tool.ruff]): test and test-fast run it first
.PHONY: lint
lint: setup
	$(PY) -m ruff check lightning_tfm tests

test: setup lint
	$(PYTEST) -m "not long" $(PYTEST_ARGS)

# the long end-to-end tests make test leaves out (marked long on the tests themselves): several sweeps each, ~15 minutes
test-long: setup
	$(PYTEST) -m long $(PYTEST_ARGS)

# the tests marked marian (skipped where transformers is missing: make test), then the benchmark at its default
# shapes; ARGS="--device cuda --json" or ARGS="bench.batch=256 ..." are passed to ltfm bench
bench: $(VENV)/.bench
	$(PY) -m pytest -q -m marian $(PYTEST_ARGS)
	$(VENV)/bin/ltfm bench --vs marian $(ARGS)

# make gpu-check: the first thing to run on a GPU machine (tests/gpu_check.sh: CUDA tests, bf16 smoke run, evaluate and
# translate, bench against Marian, 1-GPU DDP, the GPU protocol's rows for a trial's time, make ablation QUICK=1), each step
# timed within an 8-minute budget; gpu-check.log and summary.md in results-gpu-check/. Without CUDA: its rehearsal (the
# CPU-side steps; the GPU steps listed as skipped). make gpu-prep: .gpu-carry/ for a lent GPU machine (tests/gpu/prep.sh:
# the wheels its image lacks, the Multi30k copy, the size that travels); the device call is at the top of gpu_check.sh.
gpu-check: $(VENV)/.bench
	PY=$(PY) $(if $(filter command line environment,$(origin DATA)),DATA=$(DATA),) bash tests/gpu_check.sh

gpu-prep:
	PY=$(PY) DATA=$(if $(DATA),$(DATA),../shared/data/multi30k) bash tests/gpu/prep.sh

# make soak: a sweep through a bad night (tests/soak/soak.py): 40 trials by 4 workers on SQLite and on PostgreSQL, and
# a search sweep, while a seeded chaos driver kills workers and trials, stops workers past their heartbeat, fills the
# results disk and restarts the database; then every invariant is checked (exit 1 if one breaks) and the figures
# printed (soak-out/figures.md). Root (tmpfs mounts); not part of make test. SOAK_SEED=N picks the chaos; its kill
# interval and caps are in units of the trial time it measures first, so a seed means the same on a slower machine.
# SOAK_ARGS="--storages sqlite --no-search --rows 4": a short run (8 trials) while developing the soak.
SOAK_SEED ?= 1
soak: setup
	OMP_NUM_THREADS=1 $(PY) tests/soak/soak.py --seed $(SOAK_SEED) --out soak-out $(if $(DATA),--data $(abspath $(DATA)),) $(SOAK_ARGS)

# make slurm-up: a throwaway one-node Slurm cluster on loopback (tests/slurm_cluster.py: Debian's slurm-wlm and munge,
# root), its files in SLURM_DIR; it prints the `export SLURM_CONF=...` that points sbatch, squeue and ltfm sweep
# --launcher slurm at it. make slurm-down stops it. The Slurm tests (pytest -m slurm) start their own.
SLURM_DIR ?= /tmp/ltfm-slurm
slurm-up: setup
	$(PY) tests/slurm_cluster.py up $(SLURM_DIR)

slurm-down:
	$(PY) tests/slurm_cluster.py down $(SLURM_DIR)

# the suite without the tests that train through subprocesses (marked slow): a few minutes, for development. It needs
# no ../shared: without Multi30k there the tests read the toy corpus of tests/data (those that need Multi30k itself
# are skipped, saying so)
test-fast: setup lint
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# make heldout: the held-out exports of the verdict's back-test (issue #51), sweeps/table3-cpu-heldout-{fr,s3,s4}.yaml
# in turn, each by `make reference` (one worker of one thread beside other work: HELDOUT_ARGS), so each lands in
# reports/reference/<sweep>/ with its export and provenance. Resumable: rerun the same command (HELDOUT_RESULTS: the
# results folder of the earlier part) and every finished run is kept, an unfinished one resumes from its checkpoint.
# Its runs measure curves, not the verdict's code: they trained on main's training code of commit 2ebebad (each
# export's provenance.txt). To resume or repeat them on that code rather than today's: git worktree add ../heldout
# 2ebebad, copy sweeps/table3-cpu-heldout-*.yaml in, and run make heldout there.
HELDOUT_SWEEPS ?= fr s3 s4
HELDOUT_RESULTS ?= results
HELDOUT_ARGS ?= train.threads=1 run.results_dir=$(HELDOUT_RESULTS)
heldout: setup
	@set -e; for s in $(HELDOUT_SWEEPS); do \
	  $(SUBMAKE) --no-print-directory reference SWEEP=sweeps/table3-cpu-heldout-$$s.yaml WORKERS=1 ARGS='$(HELDOUT_ARGS)' \
	    REPORT_RESULTS=$(HELDOUT_RESULTS); \
	done

# make rerender: every committed reference page re-rendered from its export by today's report code
# (reports/reference/rerender.sh; the exports and provenance stay): a no-op on a main whose pages are current
rerender: setup
	PY=$(PY) LTFM=$(VENV)/bin/ltfm bash reports/reference/rerender.sh

# make pages: the reference pages' HTML (not committed: .gitignore), built from each page's export into its folder
# (reports/reference/<name>/table3.html, compare.html) by today's report code, byte for byte the pages committed
# before (about 50 s a page on 2 busy cores: reports/timing.md, "Pipeline checks")
pages: setup
	PAGES=1 PY=$(PY) LTFM=$(VENV)/bin/ltfm bash reports/reference/rerender.sh

clean:
	rm -rf results results-quick reports/build wandb soak-out
