"""The layout of the package (design 8.1): folders are layers, one door for the state writer, old import paths
that still work, and no private name used across modules. The import direction itself is import-linter's
contract in pyproject.toml (``make lint``)."""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

import django_weft as weft
from django_weft.common.moved_paths import MOVED

PACKAGE = Path(weft.__file__).parent
LAYERS = ("common", "models", "observability", "store", "runtime", "services", "worker")
FACES = ("admin", "api", "management")
# tasks_backend: Django's TASKS setting names django_weft.tasks_backend.WeftBackend (issue 35).
FIXED = {"__init__", "apps", "checks", "conf", "exceptions", "fields", "signals", "tasks", "tasks_backend", "testing",
         "urls", "views"}
# The columns only the state writer (django_weft.store) writes.
RUN_STATE = {"status", "fence", "lease_owner", "lease_expires_at", "runnable_at"}


def modules() -> list[Path]:
    return [path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts]


def writes_of_run_state(tree: ast.AST) -> list[str]:
    """Where code assigns a run's state columns: ``x.fence = ...`` (status only on a run-like name), or
    ``Workflow.objects...update(status=...)``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in RUN_STATE:
                    owner = ast.unparse(target.value)
                    if target.attr != "status" or "run" in owner.lower() or "workflow" in owner.lower():
                        found.append(f"line {node.lineno}: {ast.unparse(target)} =")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
            chain = ast.unparse(node.func.value)
            if "Workflow.objects" in chain and RUN_STATE & {kw.arg for kw in node.keywords}:
                found.append(f"line {node.lineno}: {chain}.update(...)")
    return found


def test_only_the_store_writes_a_runs_status_lease_and_fence():
    outside = {str(path.relative_to(PACKAGE)): writes_of_run_state(ast.parse(path.read_text()))
               for path in modules() if "store" not in path.relative_to(PACKAGE).parts}
    assert {path: found for path, found in outside.items() if found} == {}
    # ...and the check sees the writes the store does make.
    assert writes_of_run_state(ast.parse((PACKAGE / "store" / "transitions.py").read_text()))


def test_the_package_root_holds_only_the_fixed_modules_and_the_layer_folders():
    flat = {path.stem for path in PACKAGE.glob("*.py")}
    assert flat == FIXED
    folders = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert folders == {*LAYERS, *FACES, "migrations"}
    for folder in LAYERS:
        assert importlib.import_module(f"django_weft.{folder}").__doc__, f"{folder}/__init__.py says what it holds"


def test_no_private_name_is_imported_from_another_module():
    imported = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("django_weft"):
                imported += [f"{path.relative_to(PACKAGE)}: {alias.name}" for alias in node.names
                             if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert imported == []


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_import_path_of_the_flat_layout_still_imports_with_a_warning(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported before by another test: import it afresh
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_the_public_names_resolve_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in weft.__all__:
            assert getattr(weft, name) is not None, name
        for path in ("django_weft.models", "django_weft.testing", "django_weft.signals", "django_weft.urls",
                     "django_weft.api.urls", "django_weft.services.liveness", "django_weft.common.codec"):
            importlib.import_module(path)


def test_no_module_imports_itself_through_others():
    """No circle between modules (imports for type checking aside); import-linter's contract only sees layers."""
    grimp = pytest.importorskip("grimp")  # import-linter's graph, a dev dependency
    graph = grimp.build_graph("django_weft", exclude_type_checking_imports=True)
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                circles.append(f"{module} -> {imported} -> ... -> {module}")
    assert circles == []
