# rollout-bench: everything starts from a fresh machine with only Python 3.11.
#   make demo   create .venv, install, run the default job, print where the report is
#   make test   create .venv with the test extras, run the whole suite

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check --quiet
export HF_HUB_OFFLINE := 1

.PHONY: demo test traces tokenizer clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "rollout-bench needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e . -c constraints.txt
	touch $@

$(VENV)/.installed-test: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) install -e '.[test,transformers]' -c constraints.txt
	touch $@ $(VENV)/.installed

# The default run finds the seed-000 crash, so its exit status is 1 (violations): that is the demo.
demo: $(VENV)/.installed
	$(BIN)/rollout-bench run --out reports/demo; test $$? -le 1

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Regenerate the shipped traces (a test checks they match these commands byte for byte).
traces: $(VENV)/.installed
	$(BIN)/rollout-bench synth --kind rlvr --n 500 --seed 1 --out traces/rlvr-500.jsonl.gz
	$(BIN)/rollout-bench synth --kind agentic --n 500 --seed 1 --out traces/agentic-500.jsonl.gz

# Regenerate the shipped tokenizer folder (a test checks it matches byte for byte).
tokenizer: $(VENV)/.installed
	$(BIN)/python -m bench.tokenizer.build

clean:
	rm -rf $(VENV) reports .pytest_cache .hypothesis dist build
