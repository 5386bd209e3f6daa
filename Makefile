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
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,models,ray,vlm,serve]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cxrground synth --out $(DEMO_OUT)/cohort --studies 24 --seed 0
	$(BIN)/cxrground synth-info $(DEMO_OUT)/cohort
	@row=$$(sed -n 2p $(DEMO_OUT)/cohort/index.csv); study=$$(echo "$$row" | cut -d, -f2); \
	  image=$$(echo "$$row" | cut -d, -f5); masks=$(DEMO_OUT)/cohort/masks/$$study; \
	  $(BIN)/cxrground anatomy show --image $(DEMO_OUT)/cohort/$$image --right $$masks/right_lung.png \
	    --left $$masks/left_lung.png --heart $$masks/heart.png --out $(DEMO_OUT)/anatomy.png | head -1
	$(BIN)/cxrground ils build --images $(DEMO_OUT)/cohort/files --out $(DEMO_OUT)/ils --seed 0
	$(BIN)/cxrground ils stats $(DEMO_OUT)/ils
	$(BIN)/cxrground ils gallery $(DEMO_OUT)/ils --images $(DEMO_OUT)/cohort/files
	@echo "look at: $(DEMO_OUT)/cohort/preview.png (cohort with lesion masks), $(DEMO_OUT)/anatomy.png (geometry),"
	@echo "         $(DEMO_OUT)/ils/gallery.html, card.md and mimic_ils_instruction_answer.json (the ILS dataset)"

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .ruff_cache
