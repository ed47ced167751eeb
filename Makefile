# memlab: two commands matter.
#   make book   set up .venv, execute every notebook, write _build/html
#   make test   set up, build the book, then run every test (lint, unit, nbval, labs, browser)
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export MEMLAB_SCALE ?= ci
export PYTHONHASHSEED := 0
TIMINGS := _build/timings.txt

.PHONY: setup book test lint unit nbval labs browser student chromium freeze clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

book: setup
	@mkdir -p _build
	@start=$$(date +%s); \
	$(BIN)/jupyter-book build . -n -W --keep-going; \
	echo "book build: $$(( $$(date +%s) - start )) s" | tee -a $(TIMINGS)

lint: setup
	$(BIN)/ruff check src tests scripts chapters labs

unit: setup
	$(BIN)/python -m pytest -q -m "not browser" tests

nbval: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env chapters labs

student: setup
	$(BIN)/python scripts/make_student.py labs --out labs/student

browser: setup chromium
	MEMLAB_REQUIRE_HTML=1 $(BIN)/python -m pytest -q -m browser tests

chromium:
	@bash scripts/ensure_chromium.sh

# One pytest run over the unit tests, the notebooks (nbval), the labs and the browser test.
test: setup chromium
	@mkdir -p _build; rm -f $(TIMINGS)
	@$(MAKE) --no-print-directory book
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint; \
	MEMLAB_REQUIRE_HTML=1 $(BIN)/python -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env \
	    tests chapters labs 2>&1 | tee _build/pytest.log; \
	echo "tests: $$(( $$(date +%s) - start )) s" | tee -a $(TIMINGS)

freeze:
	rm -rf /tmp/memlab-freeze && $(PYTHON) -m venv /tmp/memlab-freeze
	/tmp/memlab-freeze/bin/pip install --quiet torch==2.13.0 -e '.[notebook,compare,dev]' "jupyter-book<2"
	/tmp/memlab-freeze/bin/pip freeze | grep -v '^-e\|^memlab' | sed 's/^torch==.*/torch==2.13.0/' > requirements.txt

clean:
	rm -rf _build labs/student
