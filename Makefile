# Lightspeed. `make help` lists the targets.
#
# Environment: everything runs in a local virtual environment, .venv/ (VENV=path to use another),
# made on first use by any target that needs it (scripts/install.py). torch is installed first, as TORCH
# says: `auto` is the CUDA build where an NVIDIA driver is found, else the CPU build (plain `torch`
# where PyTorch's CPU index cannot be reached); any other value goes to the installer as it is, e.g.
#   make install TORCH="torch==2.13.0"
#
# Overrides: `make train trainer.max_epochs=3 data.batch_size=128` passes each KEY=VALUE to Hydra;
# for what make cannot carry (`+key=value`, `~key`, `-m`, values with spaces) use ARGS="...". ARGS is
# split into words as a shell splits them (ARGS="-m '+x=a b'" is two words: -m, +x=a b) and nothing in
# it is expanded or run: ARGS="-m experiment=glob(*)" reaches Hydra as it is.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= auto
EXTRAS ?= dev
WORKERS ?= auto
ARGS ?=
PY := $(VENV)/bin/python
_comma := ,
STAMP := $(VENV)/.installed-$(subst $(_comma),+,$(EXTRAS))

# $(call _sq,text): text as one word for /bin/sh, in single quotes (each ' inside as '\'').
_sq = '$(subst ','\'',$(1))'

# The KEY=VALUE words given on make's command line, in the order given, minus make's own settings.
# make lists them last-first and escapes them ('\ ' a space, '\\' a backslash, '$$' a dollar): undo that,
# keeping escaped spaces inside one word.
_space := $(subst ,, )
_reverse = $(if $(1),$(call _reverse,$(wordlist 2,$(words $(1)),$(1))) $(firstword $(1)))
_cli := $(filter-out PYTHON=% VENV=% TORCH=% EXTRAS=% WORKERS=% ARGS=% RUNS=% NAME=% DEST=% KEEP=% ENGINE=% IMAGE=% VARIANT=% DOCKER_BUILD=% DOCKER_RUN=% LOGS=% DATA=%,$(subst \$(_space),@SPACE@,$(subst \\,@BACKSLASH@,$(-*-command-variables-*-))))
OVERRIDES := $(foreach w,$(call _reverse,$(_cli)),$(call _sq,$(subst $$$$,$$,$(subst @BACKSLASH@,\,$(subst @SPACE@,$(_space),$(w))))))

# ARGS's words for a recipe. Pasted into one as it was, /bin/sh globbed and ran what ARGS held
# (ARGS="-m experiment=glob(*)" was a syntax error), and make expanded its $(...) first. make cannot split
# words as a shell does, and a shell that splits (eval) expands too: so Python's shlex splits ARGS's text
# as given ($(value ARGS), single-quoted) and quotes each word back for /bin/sh (shlex.quote). The recipe
# then holds the words the program gets, and `make -n` shows the command as it runs.
# $(call _args,all|multirun|rest): all of ARGS's words, its -m/--multirun only, or all but those.
# Quotes that do not close stop make with the reason (shlex's), before anything runs.
_split := import shlex, sys; sys.excepthook = lambda kind, error, tb: print("!ARGS!", error); \
	mode, text = sys.argv[1:]; multirun = ("-m", "--multirun"); \
	print(" ".join(shlex.quote(w) for w in shlex.split(text) if mode == "all" or (w in multirun) == (mode == "multirun")))
_args = $(if $(strip $(value ARGS)),$(call _args_or_stop,$(shell $(PYTHON) -c $(call _sq,$(_split)) $(1) $(call _sq,$(value ARGS)))))
_args_or_stop = $(if $(or $(filter !ARGS!,$(firstword $(1))),$(filter-out 0,$(.SHELLSTATUS))),$(error ARGS="$(value ARGS)": \
	$(or $(strip $(patsubst !ARGS!,,$(1))),$(PYTHON) failed) (ARGS is split as a shell splits words; quote a ' as "'" or \')),$(1))
ARGS_WORDS = $(call _args,all)
# Nor is ARGS exported to the recipes (make would expand its $(...) to do so).
unexport ARGS

# Hydra's -m (--multirun) must come before the overrides: it is moved there from ARGS.
MULTIRUN = $(call _args,multirun)
REST = $(call _args,rest)
HYDRA_ARGS = $(call _hydra_args,$(MULTIRUN),$(REST))
_hydra_args = $(if $(1),$(1) )$(OVERRIDES)$(if $(2), $(2))

# make exits 2 whenever a recipe fails: scripts/exit_code.sh says the program's own code and what it
# means first. (Schedulers should call `python -m lightspeed.train` directly, to see its code.)
explain = bash scripts/exit_code.sh $$? "$(1)"

.DEFAULT_GOAL := help
.PHONY: help install train eval viz shards export compare doctor bench tune test test-full bench-data chaos gpu-check lint format clean

help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) scripts/install.py --torch "$(TORCH)" --extras "$(EXTRAS)"
	@touch $@

install: $(STAMP)  ## make .venv: torch (TORCH=auto: CUDA build with an NVIDIA driver, else CPU), then this package with EXTRAS (dev; dev,streaming)

train: $(STAMP)  ## train (default: CNN on digits); KEY=VALUE overrides, ARGS="..." for the rest
	$(PY) -m lightspeed.train $(HYDRA_ARGS) || $(call explain,python -m lightspeed.train)

eval: $(STAMP)  ## test the newest run's best checkpoint (ckpt_path=... for another, predict=true)
	$(PY) -m lightspeed.eval $(HYDRA_ARGS) || $(call explain,python -m lightspeed.eval)

shards: $(STAMP)  ## write a data set as LitData shards for data=shards (data=<name> shards.out=<folder>)
	$(PY) -m lightspeed.shards $(OVERRIDES) $(REST) || $(call explain,python -m lightspeed.shards)

viz: $(STAMP)  ## the first layers' feature maps and the worst test predictions as PNGs (ckpt_path=..., default: latest)
	$(PY) -m lightspeed.eval viz=true $(OVERRIDES) $(REST) || $(call explain,python -m lightspeed.eval)

export: $(STAMP)  ## a checkpoint as ONNX (checked with onnxruntime) and torch.export (ckpt_path=..., default: latest)
	$(PY) -m lightspeed.export $(OVERRIDES) $(REST) || $(call explain,python -m lightspeed.export)

compare: $(STAMP)  ## several runs on one chart and a table: RUNS="<run name or folder> ..." (-> logs/compare.png)
	$(PY) -m lightspeed.compare $(RUNS) $(ARGS_WORDS)

.PHONY: new-project
new-project:  ## a project of your own on this engine: NAME=my_project DEST=../my_project [KEEP="mnist cifar10"] [ENGINE=url]
	$(PYTHON) scripts/new_project.py --keep=$(call _sq,$(value KEEP)) --engine=$(call _sq,$(value ENGINE)) -- $(call _sq,$(value NAME)) $(call _sq,$(value DEST))

doctor: $(STAMP)  ## what this machine can do: versions, GPU, bandwidth, TFLOP/s, warnings (ARGS="--json f")
	$(PY) -m lightspeed.doctor $(ARGS_WORDS)

test: $(STAMP)  ## the fast test suite, a process per core (under 4 min on 2 CPU cores; WORKERS=1 for one)
	$(PY) -m pytest -m "not slow" -n $(WORKERS) --dist loadgroup $(ARGS_WORDS)

test-full: $(STAMP)  ## every test, the slow ones too
	$(PY) -m pytest $(ARGS_WORDS)

bench: $(STAMP)  ## presets and single-knob ablations -> bench.md, bench.png (ARGS="--steps 100 --configs off,max")
	$(PY) -m lightspeed.bench $(OVERRIDES) $(ARGS_WORDS)

tune: $(STAMP)  ## measure the speed knobs here, write conf/accel/tuned.yaml (make train accel=tuned)
	$(PY) -m lightspeed.tune $(OVERRIDES) $(ARGS_WORDS) || $(call explain,tune)

bench-data: $(STAMP)  ## loaders, then the three data paths (memory, files, shards): samples/s (scripts/bench_data.py)
	$(PY) scripts/bench_data.py $(ARGS_WORDS)

chaos: $(STAMP)  ## kill training at random moments, resume, compare with an uninterrupted run (ARGS="--trials 5")
	$(PY) scripts/chaos.py $(ARGS_WORDS)

gpu-check: $(STAMP)  ## every GPU check in one go, results in gpu_out/ (scripts/gpu_check.sh)
	PY=$(PY) bash scripts/gpu_check.sh

lint: $(STAMP)  ## ruff: lint and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)  ## ruff: fix what it can, then format
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:  ## remove logs, caches and build leftovers (keeps .venv)
	rm -rf logs outputs multirun .pytest_cache .ruff_cache src/*.egg-info
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

IMAGE ?= lightspeed
include scripts/docker.mk
