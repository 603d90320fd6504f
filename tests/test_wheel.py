"""The built wheel holds what a project runs and nothing else (README "Install": no package on an index yet).

``python -m build`` (what the README says) builds the sdist, then the wheel from the sdist; both are built
here once for the module, into a temporary directory, with ``--no-isolation`` (the installed hatchling,
no network). A second build, of a copy of the package with stray files planted in it, shows the
``[tool.hatch.build.targets.wheel]`` rules leave out benchmark data, databases and tests. A couple of
seconds in all; skipped when ``build`` or ``hatchling`` is not installed.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_weft"
MISSING = [name for name in ("build", "hatchling") if importlib.util.find_spec(name) is None]

pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"building the wheel needs {' and '.join(MISSING)} installed (pip install build "
    "hatchling): the build runs with --no-isolation, without network")

# Suffixes a project needs from the package at run time.
RUNTIME_SUFFIXES = {".py", ".html", ".txt", ".css", ".js", ".svg", ".png", ".mo", ".typed"}


def build(source: Path, outdir: Path, *args: str) -> list[Path]:
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), *args,
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout}\n{done.stderr}"
    return sorted(outdir.iterdir())


def source_files(root: Path, folder: str, pattern: str = "*") -> set[str]:
    return {str(p.relative_to(root)) for p in (root / folder).rglob(pattern)
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`python -m build` of this checkout: the sdist and the wheel built from it."""
    outdir = tmp_path_factory.mktemp("dist")
    built = build(ROOT, outdir)
    wheel = next(p for p in built if p.suffix == ".whl")
    sdist = next(p for p in built if p.name.endswith(".tar.gz"))
    return {"wheel": wheel, "sdist": sdist}


@pytest.fixture(scope="module")
def wheel_files(dist: dict[str, Path]) -> set[str]:
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        return set(wheel.namelist())


def test_the_wheel_is_named_as_the_readme_says(dist):
    assert dist["wheel"].name == "django_weft-0.1.0-py3-none-any.whl"
    assert dist["sdist"].name == "django_weft-0.1.0.tar.gz"


def test_the_wheel_holds_every_module_template_static_file_and_migration(wheel_files):
    assert source_files(ROOT, "django_weft", "*.py") <= wheel_files  # migrations, commands, runtime, admin
    assert source_files(ROOT, "django_weft/templates") <= wheel_files
    assert source_files(ROOT, "django_weft/static") <= wheel_files
    assert {"django_weft/py.typed", "django_weft/migrations/0001_initial.py", "django_weft/migrations/__init__.py",
            "django_weft/templates/admin/django_weft/workflow/change_list.html",
            "django_weft/static/django_weft/admin.css",
            "django_weft/management/commands/weft_maintenance.py"} <= wheel_files


def test_the_wheel_holds_nothing_else(wheel_files):
    top = {name.split("/")[0] for name in wheel_files}
    assert top == {"django_weft", "django_weft-0.1.0.dist-info"}, top  # no tests/, testproject/, bench/, docs/
    assert not [name for name in wheel_files if "bench" in name], "the benchmarks live in bench/, not in the wheel"
    package = {name for name in wheel_files if name.startswith("django_weft/")}
    assert {Path(name).suffix or Path(name).name for name in package} <= RUNTIME_SUFFIXES | {"py.typed"}
    parts = {part for name in package for part in Path(name).parts}
    assert not parts & {"tests", "testproject", "testapp", "__pycache__", "conftest.py"}, parts
    assert not [name for name in package if Path(name).name.startswith("test_")]


def test_the_wheel_metadata_declares_the_dependencies_and_extras(dist):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        metadata = Parser().parsestr(wheel.read("django_weft-0.1.0.dist-info/METADATA").decode())
    requires = " ".join(metadata.get_all("Requires-Dist") or [])
    for needed in ("django", "croniter", "msgpack", "cron-descriptor", "psycopg", "celery"):
        assert needed in requires.lower(), requires
    assert {"postgres", "celery"} <= set(metadata.get_all("Provides-Extra") or [])
    assert "Typing :: Typed" in (metadata.get_all("Classifier") or [])


def test_the_sdist_holds_the_tests_but_no_local_state(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "django_weft/py.typed", "tests/conftest.py", "bench/core.py"} <= names
    assert not [n for n in names if n.endswith((".sqlite3", ".pyc")) or n.startswith((".hypothesis/", "artifacts/",
                                                                                       ".venv/"))]


def test_stray_files_in_the_package_stay_out_of_the_wheel(tmp_path):
    """Benchmark output, databases and tests that land in the package folder are not shipped."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "django_weft", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    planted = ["django_weft/bench/results/latest.json", "django_weft/bench/seed-data.csv", "django_weft/demo.sqlite3",
               "django_weft/tests/test_inside.py", "django_weft/runtime/test_scratch.py", "django_weft/notes.md"]
    for name in planted:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text("x = 1\n" if name.endswith(".py") else "stray\n")
    built = build(source, tmp_path / "dist", "--wheel")
    with zipfile.ZipFile(next(p for p in built if p.suffix == ".whl")) as wheel:
        names = set(wheel.namelist())
    assert not set(planted) & names, set(planted) & names
    assert "django_weft/py.typed" in names and "django_weft/static/django_weft/admin.css" in names
