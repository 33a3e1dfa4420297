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

bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(PY) $$script || exit 1; done

compare: $(STAMP)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements.lock -e ".[compare]"
	$(PY) benchmarks/compare_sb3.py --task ppo-cartpole --repeats 3
	$(PY) benchmarks/compare_sb3.py --task sac-pendulum --repeats 3

clean:
	rm -rf $(VENV)
