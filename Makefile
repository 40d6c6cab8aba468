# Two entry points: `make demo` and `make test`. Both set up .venv first.
VENV ?= .venv

.PHONY: setup demo test lint

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/tracetap demo

test: setup
	bash scripts/test.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python scripts/typecheck.py
