# The whole set-up: `make repro` builds every enabled task, `make test` runs the tests.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: repro test test-quick lock clean-venv

PIP := $(BIN)/pip install --quiet --quiet --disable-pip-version-check  # -qq: errors only

# (Re)install whenever the lock changes: torch first, at requirements.txt's version (its build is whichever the
# README's line or pip's settings give), then every other package at the version requirements.lock pins.
$(STAMP): requirements.lock
	python3 -m venv $(VENV)
	$(PIP) "$$(grep -E '^torch==' requirements.txt)"
	$(PIP) -r requirements.lock
	touch $(STAMP)

# requirements.lock from requirements.txt, after an edit there: every package pinned but torch (its build is the
# user's), each with the reason it is there
lock: $(STAMP)
	$(BIN)/pip-compile --quiet --strip-extras --no-emit-index-url --no-emit-find-links --unsafe-package torch \
		--output-file requirements.lock requirements.txt

repro: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

test: $(STAMP)
	$(BIN)/ruff check --quiet .
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n auto

# The edit-test loop: the unit tests, without those marked slow (pyproject.toml's markers)
test-quick: $(STAMP)
	$(BIN)/ruff check --quiet .
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n auto -m "not slow"

clean-venv:
	rm -rf $(VENV)
