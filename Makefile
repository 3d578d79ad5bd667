# make ablation : set up .venv and run the main job (Table 3 on Multi30k at CPU scale, then its report)
# make test     : set up .venv and run the test suite (what CI runs)
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
ARGS ?=

.PHONY: setup ablation test train clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: an open range would pull a multi-GB CUDA build on a machine without torch.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

ablation: setup
	$(VENV)/bin/ltfm train $(EXPERIMENT) $(DATA_ARGS) $(ARGS)

train: setup
	$(VENV)/bin/ltfm train $(EXPERIMENT) $(DATA_ARGS) $(ARGS)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf results reports/build wandb
