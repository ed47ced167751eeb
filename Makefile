# memlab: two commands matter.
#   make book   set up .venv, execute every notebook, write _build/html
#   make test   set up, build the book, then run every test (lint, unit, nbval, labs, browser)
#   make unit   the fast inner loop: unit tests, no slow or browser tests, no book needed
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The book and its checked outputs are made at CI scale on the CPU, whatever the machine has.
export MEMLAB_SCALE ?= ci
export MEMLAB_DEVICE ?= cpu
export PYTHONHASHSEED := 0
TIMINGS := _build/timings.txt

.PHONY: setup book test lint unit nbval labs browser student student-check system freeze clean gpu-prepare gpu-unpack dist autograders

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@PYTHON=$(PYTHON) bash scripts/ensure_system.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	@$(BIN)/python -m pip uninstall --quiet --yes memlab 2>/dev/null || true  # the distribution's old name
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# jupyter-cache keys on a notebook's code cells only: when the library changes, run them again.
SRC := $(shell find src -name "*.py" -o -name "*.js")
_build/.src-stamp: $(SRC)
	rm -rf _build/.jupyter_cache _build/.memlab-cache
	@mkdir -p _build && touch $@

# A new or changed record under results/ re-executes the notebooks that read records (and only
# those): jupyter-cache sees code cells, not the files they read.
RESULTS := $(shell find results -name "*.json")
_build/.results-stamp: $(RESULTS) | _build/.src-stamp
	$(BIN)/python scripts/records_changed.py _build/.jupyter_cache
	@mkdir -p _build && touch $@

book: setup student-check _build/.src-stamp _build/.results-stamp
	@mkdir -p _build
	@start=$$(date +%s); \
	MEMLAB_CACHE_DIR=$(CURDIR)/_build/.memlab-cache $(BIN)/jupyter-book build . -n -W --keep-going; \
	echo "book build: $$(( $$(date +%s) - start )) s" | tee -a $(TIMINGS)
	@$(BIN)/python scripts/notebook_times.py _build/.jupyter_cache | tee -a $(TIMINGS)

lint: setup
	$(BIN)/ruff check src tests scripts chapters labs appendix _ext conftest.py
	$(BIN)/lint-imports --no-cache

# The inner loop: unit tests without the slow ones and without a built book.
unit: setup
	$(BIN)/python -m pytest -q -m "not slow and not browser" tests

nbval: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env --nbval-cell-timeout=600 chapters labs labs/student

# The book publishes each lab's student version (solutions, mark schemes and hidden tests out), and a
# launch button opens it from the repository: labs/student/ is committed. After editing a lab
# (labs/*.ipynb, the instructor version), run `make student` and commit labs/student/.
student: setup
	rm -f labs/student/*.ipynb
	$(BIN)/python -m memlab.labs.student labs --out labs/student

# Each lab's checks as an otter-grader autograder zip (autograders/<lab>.zip): `otter run` grades a
# notebook with it locally, and the same zip uploads to Gradescope (README, "For instructors").
autograders: setup
	$(BIN)/python -m memlab.labs.otter labs --out autograders

# The book build stops here when a committed student version is not what its lab now gives.
student-check: setup
	$(BIN)/python -m memlab.labs.student labs --out labs/student --check

browser: setup system
	MEMLAB_REQUIRE_HTML=1 $(BIN)/python -m pytest -q -m browser tests

system:
	@PYTHON=$(PYTHON) bash scripts/ensure_system.sh --browser

# The book build executes each notebook once (a lab: its student version); one pytest run then
# checks the notebooks against the executed copies in jupyter-cache (nbval, --nbval-executed: no
# second execution; an instructor lab against its student version's execution, cell for shared
# cell), runs the unit tests, nbgrader over the instructor versions (full marks) and the browser
# tests over the built HTML.
test: setup system
	@mkdir -p _build; rm -f $(TIMINGS)
	@$(MAKE) --no-print-directory book
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint; \
	MEMLAB_REQUIRE_HTML=1 $(BIN)/python -m pytest -p no:cacheprovider --nbval-executed _build/.jupyter_cache \
	    --durations=15 chapters labs appendix tests 2>&1 | tee _build/pytest.log; \
	echo "tests: $$(( $$(date +%s) - start )) s" | tee -a $(TIMINGS)

# The GPU call (README, "Recording the GPU side"): prepare here, run scripts/gpu_pass.sh on the
# GPU machine, then unpack what it wrote here: records into results/, checked, and the book
# rebuilt (the notebooks that read records run again).
gpu-prepare: setup
	$(BIN)/python scripts/gpu_prepare.py

gpu-unpack: setup
	@test -n "$(ARCHIVE)" || { echo "usage: make gpu-unpack ARCHIVE=<folder the GPU call wrote>"; exit 2; }
	$(BIN)/python -m memlab unpack-records $(ARCHIVE)/gpu-pass.tar.gz
	@if [ -f $(ARCHIVE)/notebooks.json ]; then \
	  $(BIN)/python -c "import sys; from memlab.nbexec import merge_reports; merge_reports(*sys.argv[1:])" \
	      results/_notebooks/cuda.json $(ARCHIVE)/notebooks.json && echo "merged results/_notebooks/cuda.json"; fi
	$(BIN)/python -m memlab check-records
	@$(MAKE) --no-print-directory book

freeze:
	rm -rf /tmp/memlab-freeze && $(PYTHON) -m venv /tmp/memlab-freeze
	/tmp/memlab-freeze/bin/pip install --quiet torch==2.13.0 -e '.[notebook,compare,dev]' "jupyter-book<2"
	/tmp/memlab-freeze/bin/pip freeze | grep -v '^-e\|^memlab' | sed 's/^torch==.*/torch==2.13.0/' > requirements.txt

# The library's distribution, memlab-book: the sdist and the wheel in dist/, checked as PyPI will
# (the release workflow does the same on a tag; tests/test_wheel.py installs the wheel and runs it).
dist: setup
	rm -rf dist
	$(BIN)/python -m build --outdir dist
	$(BIN)/python -m twine check --strict dist/*

clean:
	rm -rf _build dist
