# The two commands the README promises, each doing its own set-up:
#   make run    serve poolgate (embedded demo upstream when no config is given)
#   make test   run the whole test suite
# Everything installs into .venv; nothing outside the checkout is touched
# except the Debian packages the tests need (redis-server, chromium) when missing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
ARGS   ?=

.PHONY: run test install bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/poolgate serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

bench: $(STAMP)
	$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .cache
