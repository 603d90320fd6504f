# One command for the demo, one for the tests. Only python3 (3.11+) is needed; everything else is
# installed into .venv from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MANAGE := $(PY) testproject/manage.py
# The MySQL/MariaDB driver (mysqlclient, the mysql extra) compiles against the MariaDB/MySQL client headers
# (libmariadb-dev and pkg-config on Debian), so it is installed only when DATABASE_URL asks for MySQL: `make test`
# on a machine without those headers keeps working.
ifneq ($(filter mysql://% mariadb://%,$(DATABASE_URL)),)
INSTALLED := $(VENV)/.installed-mysql
else
INSTALLED := $(VENV)/.installed
endif

.PHONY: demo test soak lint typecheck check-migrations bench bench-dbos clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[postgres,celery,api,metrics,tracing,encryption]" --group dev
	touch $@

$(VENV)/.installed-mysql: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[postgres,celery,api,metrics,tracing,encryption,mysql]" --group dev
	touch $@

demo: $(VENV)/.installed
	$(PY) testproject/run_demo.py

test: $(INSTALLED)
	$(PY) -m pytest $(PYTEST_ARGS)

# The bounded soak test (tests/test_soak.py, a few minutes; PostgreSQL or MySQL/MariaDB, skipped on SQLite).
soak: $(INSTALLED)
	$(PY) -m pytest -m soak -n 0 $(PYTEST_ARGS)

# ruff, and the layer contract of design 8.1 ([tool.importlinter] in pyproject.toml).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	PYTHONPATH=. $(VENV)/bin/lint-imports --no-cache

# mypy over the package (not the tests) with django-stubs; its plugin imports tests.settings, which needs the
# test project on the path. Configuration: [tool.mypy] in pyproject.toml.
typecheck: $(VENV)/.installed
	PYTHONPATH=.:testproject $(VENV)/bin/mypy

check-migrations: $(INSTALLED)
	$(MANAGE) makemigrations --check --dry-run
	$(MANAGE) makemigrations --check --dry-run --settings tests.settings

bench: $(INSTALLED)
	$(MANAGE) migrate --verbosity 0
	DJANGO_DEBUG=0 $(MANAGE) weft_bench $(BENCH_ARGS)

# django_weft beside DBOS Transact (bench/compare_dbos.py), on the PostgreSQL server of DATABASE_URL. DBOS lives in a
# virtualenv of its own: it is the peer we measure against, never a dependency.
DBOS_VENV ?= .venv-dbos
$(DBOS_VENV)/.installed:
	$(PYTHON) -m venv $(DBOS_VENV)
	$(DBOS_VENV)/bin/python -m pip install --quiet "dbos>=3.4,<4" "psycopg[binary]>=3.2"
	touch $@

bench-dbos: $(INSTALLED) $(DBOS_VENV)/.installed
	$(PY) bench/compare_dbos.py --dbos-python $(DBOS_VENV)/bin/python $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(DBOS_VENV) testproject/demo.sqlite3* testproject/test_weft.sqlite3*
