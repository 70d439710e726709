# The two commands: `make demo` (a short real pretraining run) and `make test` (the whole suite).
# Both create or reuse the virtual environment in $(VENV), installing torch==2.13.0 first (the build pip
# finds: a local CPU wheel where the machine provides one) so that no unpinned requirement pulls another.

VENV    ?= .venv
PYTHON  ?= python3
# The demo's text: WikiText-2 from ../shared/data beside the repository where it is there, else
# fetched once into the bertforge cache (`bertforge fetch wikitext-2`). Any text instead:
# `make demo CORPUS=my.txt VALID=my-valid.txt`.
SHARED   = ../shared/data/wikitext-2
CACHE    = $(or $(BERTFORGE_CACHE),$(HOME)/.cache/bertforge)
FETCHED  = $(CACHE)/data/wikitext-2
CORPUS  ?= $(or $(wildcard $(SHARED)),$(FETCHED))/wiki.train.tokens
VALID   ?= $(or $(wildcard $(SHARED)),$(FETCHED))/wiki.valid.tokens
OUT     ?= runs/demo
CONFIG  ?= configs/demo.toml
ARGS    ?=
PY       = $(VENV)/bin/python
STAMP    = $(VENV)/.bertforge-installed

.PHONY: demo test bench gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# A rerun replaces the last demo's run folder, and nothing else: OUT must be a pretraining run (its
# data.json), empty or new.
demo: $(STAMP) $(filter $(FETCHED)/%,$(CORPUS) $(VALID))
	@if [ -n "$$(ls -A '$(OUT)' 2>/dev/null)" ] && [ ! -f '$(OUT)/data.json' ]; then \
		echo "make demo: $(OUT) holds files but no run; give another OUT=, or empty it" >&2; exit 2; fi
	rm -rf '$(OUT)'
	$(PY) -m bertforge pretrain --config $(CONFIG) --corpus $(CORPUS) --valid $(VALID) --out $(OUT) $(ARGS)
	$(PY) -m bertforge showcase --model $(OUT) --corpus $(VALID)

# Downloads and checks both files; a second demo finds them there.
$(FETCHED)/%: | $(STAMP)
	$(PY) -m bertforge fetch wikitext-2 --cache-dir $(CACHE)

# ruff, then every test, the slow ones too, in two processes (pytest-xdist; a test file stays in one,
# so its fixtures are made once; the longest files first, tests/conftest.py); `ARGS` goes to pytest,
# and a run that it leaves empty (exit 5) passes.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "slow or not slow" $(ARGS) \
		|| test $$? -eq 5

# The benchmark suite (benchmarks/README.md): prints a table, writes benchmarks/results/latest.json.
# `make bench ARGS=--quick` for a CI-sized run; `make bench ARGS="--only step"` and so on.
bench: $(STAMP)
	$(PY) -m benchmarks.run $(ARGS)

# The device check (benchmarks/gpu_check.py): the GPU tests, the step against Hugging Face and a minute
# of pretraining, in at most 8 minutes on one H100 or H200, with the machine's own python3 and torch
# ($(VENV) may hold a CPU build), into $OUT when set, else runs/gpu-check. ARGS=--smoke: on a CPU.
GPU_OUT ?= $(if $(filter environment command,$(origin OUT)),$(OUT),runs/gpu-check)
gpu-check:
	PYTHONPATH=src $(PYTHON) -m benchmarks.gpu_check --out $(GPU_OUT) $(ARGS)

clean:
	rm -rf runs .pytest_cache
