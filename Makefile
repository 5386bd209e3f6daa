# cxrground: the two commands of the README.
#   make demo  - build the virtual environment if needed, then run the main job on the synthetic cohort
#   make test  - build the virtual environment if needed, then lint and run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_OUT ?= demo_out
STAMP := $(VENV)/.cxrground-installed

.PHONY: install demo test lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cxrground synth --out $(DEMO_OUT)/cohort --studies 24 --seed 0
	$(BIN)/cxrground synth-info $(DEMO_OUT)/cohort

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .ruff_cache
