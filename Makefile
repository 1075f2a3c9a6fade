# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STORE ?= ./data

.PHONY: run test lint soak clean os-packages

# OS programs the tests drive: Debian's chromium and its chromedriver (the console's browser
# tests) and redis-server (the bench's Redis peer, run beside mqstore).
os-packages:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v redis-server >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver redis-server)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,plot,redis]' --config-settings editable_mode=compat
	touch $@

run: $(VENV)/.installed
	$(VENV)/bin/mqstore start --store $(STORE)

test: $(VENV)/.installed os-packages
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

soak: $(VENV)/.installed
	$(PY) -m pytest -q -m soak
	$(PY) -m tools.torture soak --rounds 200 --json soak.json
	$(PY) -m tools.retention_soak run --duration-s 600 --json soak-retention.json

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
