# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOY_DIR ?= toy_world
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

.PHONY: setup test test-fast demo toy-seeds toy-gpt2 smol gemma clean

setup: $(STAMP)

# torch is pinned first so that pip takes this machine's local CPU build; the project's
# own range (torch>=2.13.0) is then already satisfied and pulls nothing more.
# bubblewrap is the sandbox of model-written code (docs/SECURITY.md); without it code evaluation is refused.
$(STAMP): pyproject.toml
	@command -v bwrap >/dev/null || { echo "setup: installing bubblewrap (the sandbox for model-written code, docs/SECURITY.md)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  { $$SUDO apt-get install -y -qq bubblewrap || { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap; }; } >/dev/null 2>&1 \
	  || echo "setup: could not install bubblewrap; code evaluation will be refused until it is installed"; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(OFFLINE) $(PY) -m pytest -q -rs

test-fast: $(STAMP)
	$(OFFLINE) $(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(OFFLINE) $(VENV)/bin/logitcomp world toy build $(TOY_DIR) --if-missing
	$(OFFLINE) $(VENV)/bin/logitcomp run recipes/toy-letters.yaml

# The toy tables of docs/toy-world.md over seeds (a study: experiments/toy-world/): builds (or reuses) factorised and entangled worlds of
# seeds 0-4 under runs/toy-worlds (~3 min each) and writes runs/toy-seeds/seeds.{md,json}.
toy-seeds: $(STAMP)
	$(OFFLINE) $(PY) experiments/toy-world/toy_composition.py --worlds runs/toy-worlds --seeds 0 1 2 3 4 --out runs/toy-seeds

# The paper notebook's world: GPT-2-style base and full-model experts A->K, M->B (~4 min), composed and merged.
toy-gpt2: $(STAMP)
	$(OFFLINE) $(VENV)/bin/logitcomp world toy build toy_world_gpt2 --architecture gpt2 --full-experts --experts a2k,m2b --layout padded --if-missing
	$(OFFLINE) $(VENV)/bin/logitcomp run experiments/claims/toy-gpt2-full.yaml

# The SmolLM2 world (a real LLM, see the README): convert, train the three experts (~10 min each),
# run recipes/smol-math-code.yaml (it runs model-written code in a sandbox: HF_ALLOW_CODE_EVAL=1 opts in).
smol: $(STAMP)
	$(OFFLINE) $(VENV)/bin/logitcomp world smol build smol_world
	$(OFFLINE) $(VENV)/bin/logitcomp world smol train smol_world --experts math,code,shout
	$(OFFLINE) HF_ALLOW_CODE_EVAL=1 $(VENV)/bin/logitcomp run recipes/smol-math-code.yaml

# The Gemma 3 270M world (Gemma's terms of use, see the README): install and convert, train the three
# experts on the smol world's data, run recipes/gemma3-math-code.yaml.
gemma: $(STAMP)
	$(OFFLINE) $(VENV)/bin/logitcomp world gemma build gemma_world
	$(OFFLINE) $(VENV)/bin/logitcomp world gemma train gemma_world --experts math,code,shout
	$(OFFLINE) HF_ALLOW_CODE_EVAL=1 $(VENV)/bin/logitcomp run recipes/gemma3-math-code.yaml

clean:
	rm -rf $(VENV) $(TOY_DIR) toy_world_gpt2 smol_world smol_world_seed1 smol_styles smol_first gemma_world .pytest_cache
