# The whole set-up: `make repro` builds every enabled task, `make test` runs the tests.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: repro test test-quick clean-venv

# (Re)install whenever requirements.txt changes.
$(STAMP): requirements.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --quiet --disable-pip-version-check -r requirements.txt  # -qq: errors only
	touch $(STAMP)

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
