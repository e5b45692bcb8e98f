# The two supported entry points are `make run` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_USAGE_STATS_ENABLED := 0

# Which torch build pip installs: the CPU one unless you name another index, so that a laptop does not download
# several GB of CUDA libraries. For a CUDA build: make install TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
# (any CUDA index that PyTorch's install page lists for torch 2.13.0).
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu

.PHONY: run test check bench bench-quick install docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, from TORCH_INDEX_URL: a bare `torch` requirement would otherwise pull the CUDA build from PyPI.
	# Only torch itself looks there; its dependencies come with the package's own, from the usual index.
	$(PY) -m pip install --quiet --no-deps "torch==2.13.0" --extra-index-url $(TORCH_INDEX_URL)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/craftrl train craftrl.configs.default

test: $(STAMP)
	$(PY) -m pytest -q --durations=10

# The fast gate: lint, then the tests that start no Ray and run no learning (a few minutes on 2 cores).
check: $(STAMP)
	$(VENV)/bin/ruff check craftrl tests bench examples
	$(PY) -m pytest -q -m "not ray"

# Every benchmark behind a figure of README.md and BENCHMARKS.md, as the figure states it: about 3.5 h on 2 cores
# (the side by side with RLlib PPO on 10 seeds ~1 h, the Crafter score ~2 h). Rewrites bench/results and BENCHMARKS.md.
# Learning runs are benchmarks, not tests: make test never runs one.
bench: $(STAMP)
	$(PY) bench/run_all.py

# The benchmarks that need no learning run: about 30 min on 2 cores.
bench-quick: $(STAMP)
	$(PY) bench/run_all.py --quick

docs: $(STAMP)
	$(PY) -m craftrl.config.docs > docs/config.md

clean:
	rm -rf $(VENV) runs .pytest_cache
