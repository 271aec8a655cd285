# Two commands on a fresh machine: `make demo` and `make test` (each creates the environment first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch first and pinned: 2.13.0 is the CPU build available offline here; users may install newer versions.
TORCH ?= torch==2.13.0
# the test environment pins transformers: tests/hf_common vendors HF's model tests of exactly this version
TRANSFORMERS ?= transformers==5.23.0

.PHONY: env test demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check $(TORCH)
	$(PIP) install -q --disable-pip-version-check -e ".[dev,parsers,search]" "$(TRANSFORMERS)"
	touch $@

env: $(VENV)/.installed

test: env
	$(PY) -m pytest -q -p no:cacheprovider

demo: env
	PYTHONUNBUFFERED=1 $(PY) recipes/demo.py

bench: env
	$(PY) benchmarks/overhead.py --shape tiny --rows off --naive --out outputs/overhead-tiny.json

clean:
	rm -rf $(VENV) outputs
