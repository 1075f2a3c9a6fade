# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STORE ?= ./data

.PHONY: run test lint soak clean browser

# The console's browser tests drive Debian's chromium through its chromedriver (tests/tools/test_console.py).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,plot]' --config-settings editable_mode=compat
	touch $@

run: $(VENV)/.installed
	$(VENV)/bin/mqstore start --store $(STORE)

test: $(VENV)/.installed browser
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

soak: $(VENV)/.installed
	$(PY) -m tools.torture soak --rounds 200 --json soak.json
	$(PY) -m tools.retention_soak run --duration-s 600 --json soak-retention.json

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
