# rollout-bench: everything starts from a fresh machine with only Python 3.11.
#   make demo   create .venv, install, run the default job, print where the report is
#   make test   create .venv with the test extras and the real targets' environments, run the whole suite
#   make targets  build one virtual environment per PyPI framework in .targets/ (miles, verifiers, areal, verl,
#               verl-0.9); TARGETS="slime open-instruct prime-rl" builds the source-only frameworks' too
#   make bench  benchmarks (server throughput beside bare aiohttp, back to back and spaced out as in a run, the
#               chat route beside other mock LLM servers, repro cold vs warm worker, the memory kept for provenance, the latency `record` adds, trace
#               loading, the tokenizer beside `tokenizers`, the cost curve over trajectories and turns, the invariants'
#               scaling, the Ray sweep executor beside the local one);
#               not part of test
#   make bench-peers  one virtual environment per peer mock server in .bench/ (what `make bench` compares with)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check --quiet
export HF_HUB_OFFLINE := 1

.PHONY: demo test targets slime-env open-instruct-env prime-rl-env traces tokenizer clean bench bench-peers soak

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "rollout-bench needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e . -c constraints.txt
	touch $@

# [ray]: tests/test_sweep_ray.py runs a two-node Ray cluster on this machine (about 240 MB installed)
$(VENV)/.installed-test: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) install -e '.[test,transformers,ray]' -c constraints.txt
	touch $@ $(VENV)/.installed

# The default run finds the seed-000 crash, so its exit status is 1 (violations): that is the demo.
# --force: a second `make demo` writes over the first one's report folder.
demo: $(VENV)/.installed
	$(BIN)/rollout-bench run --out reports/demo --force; test $$? -le 1

test: $(VENV)/.installed-test targets
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Performance claims, measured as ratios in one run (README "Benchmarks"); tables also in reports/bench/.
# The repro benchmark uses real miles when its environment is built (make targets), else ref-gather.
bench: $(VENV)/.installed-test bench-peers
	$(BIN)/python -m benchmarks.server_throughput
	$(BIN)/python -m benchmarks.spaced_requests
	$(BIN)/python -m benchmarks.peer_servers
	$(BIN)/python -m benchmarks.repro_warm
	$(BIN)/python -m benchmarks.served_memory
	$(BIN)/python -m benchmarks.record_latency
	$(BIN)/python -m benchmarks.trace_loading
	$(BIN)/python -m benchmarks.tokenizer_speed
	$(BIN)/python -m benchmarks.scale_curve
	$(BIN)/python -m benchmarks.invariant_scaling
	$(BIN)/python -m benchmarks.sweep_executors

# The mock LLM servers a user would pick instead of the bench (benchmarks/peer_servers.py), each from the package
# index into its own environment; only their pinned version is ours, their dependencies are what pip resolves.
BENCH_DIR ?= .bench
BENCH_PEERS ?= fakellm==0.3.5 mockllm==0.0.8 llmock==0.2.2
bench-peers: $(foreach peer,$(BENCH_PEERS),$(BENCH_DIR)/$(firstword $(subst ==, ,$(peer)))/.built)

$(BENCH_DIR)/%/.built:
	rm -rf $(BENCH_DIR)/$*
	$(PYTHON) -m venv $(BENCH_DIR)/$*
	$(BENCH_DIR)/$*/bin/python $(TPIP) install $(filter $*==%,$(BENCH_PEERS))
	$(BENCH_DIR)/$*/bin/python -c 'import $*'
	touch $@

# 30 minutes of mixed traffic under the chaos plan: memory, descriptors, determinism (README "Soak"); not in `test`.
SOAK_MINUTES ?= 30
soak: $(VENV)/.installed-test
	$(BIN)/python -m benchmarks.soak --minutes $(SOAK_MINUTES)

# Real targets live in their own environments (heavy, conflicting pins; never the bench's .venv).
# torch is the local CPU wheel, installed first so nothing can pull a CUDA build; a check refuses one anyway.
TARGETS_DIR ?= .targets
TPIP = -m pip --disable-pip-version-check --quiet
# Each real framework keeps its environment spec (`env.txt`, every pin in `env.lock`) in its adapter folder.
FRAMEWORKS = bench/targets/frameworks

# `make targets TARGETS="areal"` builds a subset.
TARGETS ?= miles verifiers areal verl verl-0.9
targets: $(foreach target,$(TARGETS),$(TARGETS_DIR)/$(target)/.built)

$(TARGETS_DIR)/miles/.built: $(FRAMEWORKS)/miles/env.txt $(FRAMEWORKS)/miles/env.lock
	rm -rf $(TARGETS_DIR)/miles
	$(PYTHON) -m venv $(TARGETS_DIR)/miles
	$(TARGETS_DIR)/miles/bin/python $(TPIP) install torch==2.13.0
	$(TARGETS_DIR)/miles/bin/python $(TPIP) install --no-deps miles-rl==0.0.2
	$(TARGETS_DIR)/miles/bin/python $(TPIP) install -r $(FRAMEWORKS)/miles/env.txt -c $(FRAMEWORKS)/miles/env.lock
	$(TARGETS_DIR)/miles/bin/python -c 'import torch, miles; assert torch.version.cuda is None, "a CUDA torch got in"'
	touch $@

$(TARGETS_DIR)/verifiers/.built: $(FRAMEWORKS)/verifiers/env.txt $(FRAMEWORKS)/verifiers/env.lock
	rm -rf $(TARGETS_DIR)/verifiers
	$(PYTHON) -m venv $(TARGETS_DIR)/verifiers
	$(TARGETS_DIR)/verifiers/bin/python $(TPIP) install -r $(FRAMEWORKS)/verifiers/env.txt -c $(FRAMEWORKS)/verifiers/env.lock
	$(TARGETS_DIR)/verifiers/bin/python -c 'import verifiers, openai; assert openai.__version__ == "2.36.0"'
	touch $@

$(TARGETS_DIR)/areal/.built: $(FRAMEWORKS)/areal/env.txt $(FRAMEWORKS)/areal/env.lock
	rm -rf $(TARGETS_DIR)/areal
	$(PYTHON) -m venv $(TARGETS_DIR)/areal
	$(TARGETS_DIR)/areal/bin/python $(TPIP) install torch==2.13.0
	$(TARGETS_DIR)/areal/bin/python $(TPIP) install --no-deps areal==1.0.4 sglang==0.5.10.post1
	$(TARGETS_DIR)/areal/bin/python $(TPIP) install -r $(FRAMEWORKS)/areal/env.txt -c $(FRAMEWORKS)/areal/env.lock
	$(TARGETS_DIR)/areal/bin/python -c 'import torch, areal.engine.sglang_remote; assert torch.version.cuda is None, "a CUDA torch got in"'
	touch $@

# A framework installable with torch alone first: $(call torch_env,FOLDER,ENV_TXT,ENV_LOCK,MODULE_TO_IMPORT)
define torch_env
	rm -rf $(TARGETS_DIR)/$(1)
	$(PYTHON) -m venv $(TARGETS_DIR)/$(1)
	$(TARGETS_DIR)/$(1)/bin/python $(TPIP) install torch==2.13.0
	$(TARGETS_DIR)/$(1)/bin/python $(TPIP) install -r $(2) -c $(3)
	$(TARGETS_DIR)/$(1)/bin/python -c 'import torch, $(4); assert torch.version.cuda is None, "a CUDA torch got in"'
	touch $(TARGETS_DIR)/$(1)/.built
endef

$(TARGETS_DIR)/verl/.built: $(FRAMEWORKS)/verl/env.txt $(FRAMEWORKS)/verl/env.lock
	$(call torch_env,verl,$(FRAMEWORKS)/verl/env.txt,$(FRAMEWORKS)/verl/env.lock,verl.trainer.main_ppo_sync)

# verl 0.9.1 beside 0.8.0: the same adapter, which follows the installed trainer layout
$(TARGETS_DIR)/verl-0.9/.built: $(FRAMEWORKS)/verl/env-0.9.txt $(FRAMEWORKS)/verl/env-0.9.lock
	$(call torch_env,verl-0.9,$(FRAMEWORKS)/verl/env-0.9.txt,$(FRAMEWORKS)/verl/env-0.9.lock,verl.trainer.ppo.v1.replay_buffer)

# slime has no PyPI package: its environment is optional (the slime target falls back to miles' environment,
# which lacks a few of slime's imports); its source comes from a checkout (--source DIR / ROLLOUT_BENCH_SLIME_PATH).
slime-env: $(TARGETS_DIR)/slime/.built

$(TARGETS_DIR)/slime/.built: $(FRAMEWORKS)/slime/env.txt $(FRAMEWORKS)/slime/env.lock
	rm -rf $(TARGETS_DIR)/slime
	$(PYTHON) -m venv $(TARGETS_DIR)/slime
	$(TARGETS_DIR)/slime/bin/python $(TPIP) install torch==2.13.0
	$(TARGETS_DIR)/slime/bin/python $(TPIP) install -r $(FRAMEWORKS)/slime/env.txt -c $(FRAMEWORKS)/slime/env.lock
	$(TARGETS_DIR)/slime/bin/python -c 'import torch, transformers, ray; assert torch.version.cuda is None, "a CUDA torch got in"'
	touch $@

# open-instruct has no usable package either: its environment is optional (`make open-instruct-env`), its
# source a checkout (--source DIR / ROLLOUT_BENCH_OPEN_INSTRUCT_PATH). openenv-core goes in without its
# dependencies, which would pull gradio.
open-instruct-env: $(TARGETS_DIR)/open-instruct/.built

$(TARGETS_DIR)/open-instruct/.built: $(FRAMEWORKS)/open_instruct/env.txt $(FRAMEWORKS)/open_instruct/env.lock
	rm -rf $(TARGETS_DIR)/open-instruct
	$(PYTHON) -m venv $(TARGETS_DIR)/open-instruct
	$(TARGETS_DIR)/open-instruct/bin/python $(TPIP) install torch==2.13.0
	$(TARGETS_DIR)/open-instruct/bin/python $(TPIP) install -r $(FRAMEWORKS)/open_instruct/env.txt -c $(FRAMEWORKS)/open_instruct/env.lock
	$(TARGETS_DIR)/open-instruct/bin/python $(TPIP) install --no-deps openenv-core==0.3.0
	$(TARGETS_DIR)/open-instruct/bin/python -c 'import torch, ray, transformers; assert torch.version.cuda is None, "a CUDA torch got in"'
	touch $@

# prime-rl has no package that installs on CPU (vLLM, CUDA, Python 3.12): its environment is optional
# (`make prime-rl-env`), its source a checkout (--source DIR / ROLLOUT_BENCH_PRIME_RL_PATH). No torch: the adapter
# puts placeholders in place of prime-rl's GPU imports (`stubs.py`).
prime-rl-env: $(TARGETS_DIR)/prime-rl/.built

$(TARGETS_DIR)/prime-rl/.built: $(FRAMEWORKS)/prime_rl/env.txt $(FRAMEWORKS)/prime_rl/env.lock
	rm -rf $(TARGETS_DIR)/prime-rl
	$(PYTHON) -m venv $(TARGETS_DIR)/prime-rl
	$(TARGETS_DIR)/prime-rl/bin/python $(TPIP) install -r $(FRAMEWORKS)/prime_rl/env.txt -c $(FRAMEWORKS)/prime_rl/env.lock
	$(TARGETS_DIR)/prime-rl/bin/python -c 'import verifiers, openai, pydantic_config, loguru; assert openai.__version__ == "2.36.0"'
	touch $@

# Regenerate the shipped traces (a test checks they match these commands byte for byte).
traces: $(VENV)/.installed
	$(BIN)/rollout-bench synth --kind rlvr --n 500 --seed 1 --out traces/rlvr-500.jsonl.gz
	$(BIN)/rollout-bench synth --kind agentic --n 500 --seed 1 --out traces/agentic-500.jsonl.gz
	$(BIN)/rollout-bench synth --kind retool --n 64 --seed 1 --out traces/retool-64.jsonl.gz

# Regenerate the shipped tokenizer folder (a test checks it matches byte for byte).
tokenizer: $(VENV)/.installed
	$(BIN)/python -m bench.tokenizer.build

clean:
	rm -rf $(VENV) $(TARGETS_DIR) $(BENCH_DIR) reports .pytest_cache .hypothesis dist build
