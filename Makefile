# Two commands do all set-up on a fresh machine with Python 3.11, 3.12 or 3.13 and pip
# (python3.11 if there is one, else python3; PYTHON=python3.13 picks another):
#   make run    trains the default agent
#   make test   runs the test suite
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test check bench compare install clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e ".[dev,box2d,brax,envpool,jaxmarl,mujoco,pettingzoo]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/kitae train

# The checks CI makes before the tests: lint and format (ruff), types (mypy), the layers of
# docs/architecture.md (import-linter).
check: $(STAMP)
	$(VENV)/bin/ruff check kitae tests benchmarks examples
	$(VENV)/bin/ruff format --check kitae tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Two processes, one test file each at a time (a file's shared fixtures, such as a Ray runtime or a
# trained run, stay in one process).
test: check
	$(PY) -m pytest -q -n 2 --dist loadfile

# The learning benchmarks of BENCHMARKS.md's table "Re-run after the architecture change", each
# script with the table's arguments, one after the other (hours on 2 cores). A script that fails
# stops make, except bench_ppo.py, which also exits 1 when a target is missed (the leading -: make
# reports it and goes on; the others report a miss in their output and results). They write into
# benchmarks/results/, or into KITAE_BENCH_RESULTS's folder if set.
bench: $(STAMP)
	-$(PY) benchmarks/bench_ppo.py
	$(PY) benchmarks/bench_sac.py
	$(PY) benchmarks/bench_td3.py
	$(PY) benchmarks/bench_compiled_learning.py --only ppo td3 sac dqn
	$(PY) benchmarks/bench_envpool.py --only cartpole
	$(PY) benchmarks/bench_jaxmarl.py
	$(PY) benchmarks/bench_minatar.py --steps 500000 --seeds 0
	KITAE_NO_COMPILATION_CACHE=1 $(PY) benchmarks/bench_brax.py --algo ppo
	KITAE_NO_COMPILATION_CACHE=1 $(PY) benchmarks/bench_brax.py --algo sac
	$(PY) benchmarks/bench_pettingzoo.py
	$(PY) benchmarks/bench_dqn.py

compare: $(STAMP)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements.lock -e ".[compare]"
	$(PY) benchmarks/compare_sb3.py --task ppo-cartpole --repeats 3
	$(PY) benchmarks/compare_sb3.py --task sac-pendulum --repeats 3

clean:
	rm -rf $(VENV)
