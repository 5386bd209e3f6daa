# cxrground: the two commands of the README.
#   make demo  - build the virtual environment if needed, then run the main job on the synthetic cohort
#   make test  - build the virtual environments if needed, then lint and run the test suite (which also builds
#                the documentation site with mkdocs --strict and runs the runnable blocks of its pages)
#   make docs  - serve the documentation site on http://127.0.0.1:8000/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_OUT ?= demo_out
STAMP := $(VENV)/.cxrground-installed
# Optional: a package index to install torch 2.13.0 from before the extras, e.g. PyTorch's CPU wheels on a CPU machine
# (PyPI's Linux wheel of torch 2.13.0 is a CUDA build of several GB):
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Unset (the default), torch comes with the extras from the configured index, as before.
TORCH_INDEX ?=
TORCH_VERSION := 2.13.0
# The YOLO detector (ultralytics) and the cxas comparison need torchvision. Each torchvision pairs with one torch
# (0.28.0 <-> 2.13.0, 0.29.1 <-> 2.14.1), and PyPI's 0.28.0 is a CUDA build whose ops do not load beside the CPU
# torch 2.13.0 of $(VENV). So they live in a second environment with torch 2.14.1 + torchvision 0.29.1 (the 'yolo'
# extra; CUDA builds that also run on the CPU, about 5.5 GB), and `make test` runs the tests marked 'yolo' there.
YOLO_VENV ?= .venv-yolo
YOLO_BIN := $(YOLO_VENV)/bin
YOLO_STAMP := $(YOLO_VENV)/.cxrground-installed
YOLO_TESTS := tests/test_detector.py tests/test_backends_real.py

.PHONY: install demo test lint docs clean

install: $(STAMP) $(YOLO_STAMP)

# every extra but yolo (ultralytics needs a torchvision that matches torch); docs: the site the tests build
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --quiet --disable-pip-version-check 'torch==$(TORCH_VERSION)' --index-url '$(TORCH_INDEX)')
	# export: datasets, highdicom and lmms-eval (ils/percept export --format hf|dicom-seg|lmms-eval). lmms-eval pulls
	# PyPI's torchvision, a CUDA build that breaks transformers beside the CPU torch pin, and wandb, which holds
	# protobuf below 7, where transformers cannot read a SentencePiece tokenizer.model (the LISA release's). Neither
	# is needed here (lmms-eval imports wandb only for its W&B logger): both go, and protobuf is raised again.
	# store: fsspec, s3fs, gcsfs; dev: the tools of the tests, with the S3 (moto) and GCS (gcp-storage-emulator) servers
	# the object-storage tests use.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,docs,models,ray,store,vlm,serve,gen,deepspeed,export]'
	$(BIN)/python -m pip uninstall --quiet --disable-pip-version-check -y torchvision wandb
	$(BIN)/python -m pip install --quiet --disable-pip-version-check 'protobuf>=7,<8'
	touch $(STAMP)

# cxas 0.0.20 only for its network code in one comparison test: --no-deps, as it pins pydicom<3 (cxrground: >=3).
$(YOLO_STAMP): pyproject.toml
	test -x $(YOLO_BIN)/python || $(PYTHON) -m venv $(YOLO_VENV)
	$(YOLO_BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,yolo]'
	$(YOLO_BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps 'cxas==0.0.20'
	touch $(YOLO_STAMP)

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
	  --out $(DEMO_OUT)/baseline --set epochs=12 --threads 2 --no-resume --quiet
	rm -f $(DEMO_OUT)/baseline/pred_test.jsonl $(DEMO_OUT)/baseline/pred_test.jsonl.*  # the model was retrained
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

test: lint $(YOLO_STAMP)
	$(BIN)/python -m pytest -q -m "not yolo"
	YOLO_OFFLINE=1 YOLO_CONFIG_DIR=$(CURDIR)/.pytest_cache/ultralytics $(YOLO_BIN)/python -m pytest -q -m yolo $(YOLO_TESTS)

docs: $(STAMP)
	$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) $(YOLO_VENV) $(DEMO_OUT) .pytest_cache .ruff_cache
