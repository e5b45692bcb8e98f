# The two supported entry points are `make run` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: run test bench install docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# CPU torch first: a bare `torch` requirement would otherwise pull several GB of CUDA wheels.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/craftrl train craftrl.configs.default

test: $(STAMP)
	$(PY) -m pytest -q

# LONG: about 4 h on 2 cores (3 x 20 min time-to-cows, the side by side with RLlib PPO on 10 seeds drawn at run
# time, ~1 h, then 1M env steps of crafter/score for the Crafter score). `make bench BENCH_ARGS=--skip-long`
# leaves out the last two.
BENCH_ARGS ?=
bench: $(STAMP)
	# slow learning tests first; exit code 5 only means none are marked slow yet
	$(PY) -m pytest -q -m slow || test $$? -eq 5
	$(PY) bench/run_all.py $(BENCH_ARGS)

docs: $(STAMP)
	$(PY) -m craftrl.config.docs > docs/config.md

clean:
	rm -rf $(VENV) runs .pytest_cache
