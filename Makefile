# posenc: `make test` and `make demo` set themselves up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# torch 2.13.0, CPU build. CI machines' pip configuration finds its CPU wheel on local disk; elsewhere PyPI's
# torch is a multi-GB CUDA build, so point pip at the CPU index there:
#   make test TORCH_INDEX=--extra-index-url=https://download.pytorch.org/whl/cpu TORCH_PIN=torch==2.13.0+cpu
TORCH_PIN ?= torch==2.13.0
TORCH_INDEX ?=
JOBS ?= 2

.PHONY: setup test test-slow lint typecheck demo bench census clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_INDEX) "$(TORCH_PIN)"
	$(PIP) install -q $(TORCH_INDEX) -e ".[dev,rtx,triton]" "$(TORCH_PIN)"
	touch $(STAMP)

setup: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/ruff format --check src tests scripts

# mypy over src/ (its settings in pyproject.toml): clean, every remaining ignore with its reason beside it.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# `make test`: everything this machine can run in under ten minutes on 2 cores (gpu/trt tests skip with
# the reason). mypy (one core, about 20 s) runs beside pytest and fails the target after it if it fails.
# `make test-slow`: the redundant variants left out of it.
test: $(STAMP) lint
	@$(VENV)/bin/mypy > $(VENV)/.mypy.out 2>&1 & mypy=$$!; \
	$(VENV)/bin/pytest -n $(JOBS) -q -m "not slow"; status=$$?; \
	wait $$mypy; typed=$$?; cat $(VENV)/.mypy.out; \
	if [ $$typed -ne 0 ]; then echo "make test: mypy failed (above)"; exit 1; fi; exit $$status

test-slow: $(STAMP)
	$(VENV)/bin/pytest -n $(JOBS) -q -m slow

# `make census`: every text model type of the installed transformers through posenc export and validate
# --against-hf, on tiny seeded checkpoints -> docs/models.md (about an hour on 2 cores; docs/models.json caches
# each type, so a rerun does only what changed).
census: $(STAMP)
	$(VENV)/bin/posenc models --census -j $(JOBS)

demo: $(STAMP)
	$(VENV)/bin/posenc demo -o report

bench: $(STAMP)
	$(VENV)/bin/posenc bench -o bench-results

clean:
	rm -rf $(VENV) report bench-results .pytest_cache
