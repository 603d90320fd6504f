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

.PHONY: demo test test-django6 soak lint typecheck check-migrations bench bench-dbos bench-goals clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[postgres,celery,api,metrics,tracing,encryption,tasks]" --group dev
	touch $@

$(VENV)/.installed-mysql: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[postgres,celery,api,metrics,tracing,encryption,tasks,mysql]" --group dev
	touch $@

demo: $(VENV)/.installed
	$(PY) testproject/run_demo.py

test: $(INSTALLED)
	$(PY) -m pytest $(PYTEST_ARGS)

# Django 6 has the tasks framework built in (django.tasks) and needs Python 3.12+: the tasks backend's tests run on
# it too, in a venv of their own, when such a Python is on this machine (PATH or pyenv); skipped, saying so,
# otherwise. DATABASE_URL selects the database as for `make test`.
DJANGO6_VENV ?= .venv-django6
PYTHON_DJANGO6 ?= $(shell for p in python3.13 python3.12 $$HOME/.pyenv/versions/3.13*/bin/python \
	$$HOME/.pyenv/versions/3.12*/bin/python; do $$p -c 'import sys; assert sys.version_info >= (3, 12); \
	print(sys.executable)' 2>/dev/null && break; done)

test-django6:
	@if [ -z "$(PYTHON_DJANGO6)" ]; then \
	  echo "test-django6: skipped: no Python 3.12 or newer on this machine (Django 6 needs one)"; exit 0; fi; \
	if [ ! -f $(DJANGO6_VENV)/.installed ] || [ pyproject.toml -nt $(DJANGO6_VENV)/.installed ]; then \
	  $(PYTHON_DJANGO6) -m venv $(DJANGO6_VENV) && \
	  $(DJANGO6_VENV)/bin/python -m pip install --quiet "Django>=6.0,<6.2" -e ".[postgres,celery,api,metrics,tracing]" \
	    "pytest>=8" "pytest-django>=4.8" "pytest-xdist>=3.5" "hypothesis>=6.100" && touch $(DJANGO6_VENV)/.installed; fi; \
	echo "test-django6: $$($(DJANGO6_VENV)/bin/python -c 'import django, sys; print("Django", django.get_version(), "on Python", sys.version.split()[0])')"; \
	$(DJANGO6_VENV)/bin/python -m pytest -n 0 tests/test_tasks_backend.py tests/test_readme_tasks.py $(PYTEST_ARGS)

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

# The performance goals, each by its own weft_bench command, one after the other, as one table (bench/goals.py; about
# 15 minutes; BENCH_ARGS="--million" adds the million-run figures, seeding them once).
bench-goals: $(INSTALLED) $(DBOS_VENV)/.installed
	$(PY) bench/goals.py --dbos-python $(DBOS_VENV)/bin/python $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(DBOS_VENV) testproject/demo.sqlite3* testproject/test_weft.sqlite3*
