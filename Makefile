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
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,models,ray,store,vlm,serve,gen,deepspeed]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cxrground synth --out $(DEMO_OUT)/cohort --studies 64 --seed 0
	$(BIN)/cxrground synth-info $(DEMO_OUT)/cohort
	@row=$$(sed -n 2p $(DEMO_OUT)/cohort/index.csv); study=$$(echo "$$row" | cut -d, -f2); \
	  image=$$(echo "$$row" | cut -d, -f5); masks=$(DEMO_OUT)/cohort/masks/$$study; \
	  $(BIN)/cxrground anatomy show --image $(DEMO_OUT)/cohort/$$image --right $$masks/right_lung.png \
	    --left $$masks/left_lung.png --heart $$masks/heart.png --out $(DEMO_OUT)/anatomy.png | head -1
	$(BIN)/cxrground ils build --images $(DEMO_OUT)/cohort/files --out $(DEMO_OUT)/ils --seed 0 --overwrite
	$(BIN)/cxrground ils stats $(DEMO_OUT)/ils
	$(BIN)/cxrground ils gallery $(DEMO_OUT)/ils --images $(DEMO_OUT)/cohort/files
	$(BIN)/cxrground ils train --model baseline --dataset $(DEMO_OUT)/ils --images $(DEMO_OUT)/cohort/files \
	  --out $(DEMO_OUT)/baseline --set epochs=12 --no-resume --quiet
	$(BIN)/cxrground ils predict --checkpoint $(DEMO_OUT)/baseline --dataset $(DEMO_OUT)/ils \
	  --images $(DEMO_OUT)/cohort/files --split test --out $(DEMO_OUT)/baseline/pred_test.jsonl --quiet
	$(BIN)/cxrground ils evaluate --dataset $(DEMO_OUT)/ils --predictions $(DEMO_OUT)/baseline/pred_test.jsonl \
	  --split test --seg-mode free --bootstrap 200 --out $(DEMO_OUT)/baseline/eval_test.json \
	  | sed -n '/^## Segmentation/,/^### Per lesion/{/^### Per lesion/!p};/^## Text/,/^### Text accuracy per/{/^### Text/!p}'
	$(BIN)/cxrground percept build --ils $(DEMO_OUT)/ils --images $(DEMO_OUT)/cohort/files --out $(DEMO_OUT)/percept \
	  --per-lesion 2,2,2 --split all --seed 0 --overwrite
	$(BIN)/cxrground percept validate $(DEMO_OUT)/percept
	$(BIN)/cxrground percept gallery $(DEMO_OUT)/percept --out $(DEMO_OUT)/percept/gallery.html
	rm -rf $(DEMO_OUT)/runs
	$(BIN)/cxrground percept eval --bench $(DEMO_OUT)/percept --model oracle --oracle none --out $(DEMO_OUT)/runs/oracle --no-progress
	$(BIN)/cxrground percept eval --bench $(DEMO_OUT)/percept --model random --oracle none --out $(DEMO_OUT)/runs/random --no-progress
	$(BIN)/cxrground percept eval --bench $(DEMO_OUT)/percept --model ils:$(DEMO_OUT)/baseline --oracle none \
	  --out $(DEMO_OUT)/runs/ils-baseline --concurrency 1 --no-progress
	$(BIN)/cxrground percept report $(DEMO_OUT)/runs/oracle $(DEMO_OUT)/runs/random $(DEMO_OUT)/runs/ils-baseline \
	  --out $(DEMO_OUT)/runs/report.html
	@echo "look at: $(DEMO_OUT)/cohort/preview.png (cohort with lesion masks), $(DEMO_OUT)/anatomy.png (geometry),"
	@echo "         $(DEMO_OUT)/ils/gallery.html, card.md and mimic_ils_instruction_answer.json (the ILS dataset),"
	@echo "         $(DEMO_OUT)/percept/gallery.html and card.md (the CheXpercept benchmark),"
	@echo "         $(DEMO_OUT)/runs/report.html (oracle, random and the baseline ILS model as an agent on it)"

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .ruff_cache
