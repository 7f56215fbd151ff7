"""The package's layers (issue 24): a lower layer never imports a higher one.

Core maths (proposal, losses, metrics), sampling and frequency, then tasks, objectives
and models, then training and the apps, then the CLI. The data modules of
``pipelines/`` sit below training; ``pipelines/beam/`` and ``serving/`` may import
training, never the reverse. Two checks: what importing a module loads (a fresh
process's ``sys.modules``), and every import statement, lazy ones included (the AST).
"""

import ast
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Higher layers and heavy optional dependencies that the core must not load.
NOT_IN_CORE = ("apache_beam", "grpc", "tfrs_logq.serving", "tfrs_logq.pipelines.beam",
               "tfrs_logq.training", "tfrs_logq.cli")
CORE = ("tfrs_logq.losses", "tfrs_logq.tasks", "tfrs_logq.sampling", "tfrs_logq.frequency",
        "tfrs_logq.proposal", "tfrs_logq.metrics", "tfrs_logq.objectives", "tfrs_logq.models",
        "tfrs_logq.atomic", "tfrs_logq.cache")
DATA = ("tfrs_logq.pipelines.datasets", "tfrs_logq.pipelines.interactions",
        "tfrs_logq.pipelines.splits", "tfrs_logq.pipelines.sequential",
        "tfrs_logq.pipelines.synthetic", "tfrs_logq.pipelines.manifest",
        "tfrs_logq.pipelines.examples", "tfrs_logq.pipelines.item_statistics")

_LOADED = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
prefixes = tuple(json.loads(sys.argv[2]))
print(json.dumps(sorted(n for n in sys.modules
                        if any(n == p or n.startswith(p + ".") for p in prefixes))))
"""


@pytest.mark.parametrize("module", CORE + DATA)
def test_importing_a_lower_layer_loads_no_higher_one(module):
    result = subprocess.run([sys.executable, "-c", _LOADED, module, json.dumps(NOT_IN_CORE)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def _source_file(module: str) -> str:
    parts = module.split(".")
    if parts[1] == "pipelines":
        return os.path.join(ROOT, "pipelines", *parts[2:]) + ".py"
    return os.path.join(ROOT, *parts) + ".py"


def _imports(path: str) -> set[str]:
    with open(path) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):  # module level and inside functions (lazy imports)
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


# The training layer and the apps above it (training apps): they may import the core,
# the data modules and each other, never what sits above them (serving, the Beam
# pipeline, Beam or gRPC themselves, the CLI).
ABOVE_APPS = ("apache_beam", "grpc", "tfrs_logq.serving", "tfrs_logq.pipelines.beam",
              "tfrs_logq.cli")
APPS = ("tfrs_logq.training", "tfrs_logq.callbacks", "tfrs_logq.run_directory",
        "tfrs_logq.step_checkpoint",
        "tfrs_logq.trained", "tfrs_logq.diagnose", "tfrs_logq.demo", "tfrs_logq.experiment",
        "tfrs_logq.study", "tfrs_logq.study_grid", "tfrs_logq.study_report")

# Upward imports that exist today, each to be removed (issue 24); none may be added.
KNOWN_UPWARD: set = set()


def _upward(module: str, above: tuple) -> set:
    return {(module, name) for name in _imports(_source_file(module))
            if any(name == p or name.startswith(p + ".") for p in above)}


@pytest.mark.parametrize("module", CORE + DATA + ("tfrs_logq.config",))
def test_no_import_statement_reaches_a_higher_layer(module):
    upward = _upward(module, NOT_IN_CORE)
    assert upward <= KNOWN_UPWARD, sorted(upward - KNOWN_UPWARD)


@pytest.mark.parametrize("module", APPS)
def test_no_import_statement_of_the_training_apps_reaches_serving_beam_or_the_cli(module):
    upward = _upward(module, ABOVE_APPS)
    assert upward <= KNOWN_UPWARD, sorted(upward - KNOWN_UPWARD)


@pytest.mark.parametrize("module", APPS)
def test_importing_a_training_app_loads_no_serving_beam_or_cli(module):
    result = subprocess.run([sys.executable, "-c", _LOADED, module, json.dumps(ABOVE_APPS)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_diagnose_and_the_export_load_a_run_through_one_function():
    """`diagnose` no longer reaches `serving.export` for `load_trained`: both call
    `tfrs_logq.trained`, which the export re-exports."""
    assert "tfrs_logq.trained" in _imports(_source_file("tfrs_logq.diagnose"))
    export = os.path.join(ROOT, "serving", "export.py")
    assert "tfrs_logq.trained.load_trained" in _imports_with_names(export)


def test_known_upward_imports_are_still_there():
    """A known exception that was fixed must leave the list (so the list stays true)."""
    for module, name in KNOWN_UPWARD:
        assert name in _imports(_source_file(module)), (module, name)


@pytest.mark.parametrize("module", ["tfrs_logq.metrics", "tfrs_logq.atomic", "tfrs_logq.cache",
                                    "tfrs_logq.hostinfo", "tfrs_logq.pipelines.beam.evaluation"])
def test_the_metric_formulas_and_utilities_import_without_tensorflow(module):
    """Recall/NDCG (used by the serving client and Beam workers), atomic writes and the
    cache location load no TensorFlow."""
    result = subprocess.run([sys.executable, "-c", _LOADED, module, json.dumps(["tensorflow"])],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def _package_modules():
    """Every module of the installed package: (dotted name, source file)."""
    roots = {"tfrs_logq": os.path.join(ROOT, "tfrs_logq"),
             "tfrs_logq.pipelines": os.path.join(ROOT, "pipelines"),
             "tfrs_logq.serving": os.path.join(ROOT, "serving")}
    for package, directory in roots.items():
        for parent, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            rel = os.path.relpath(parent, directory)
            prefix = package if rel == "." else f"{package}.{rel.replace(os.sep, '.')}"
            for name in sorted(files):
                if name.endswith(".py"):
                    module = prefix if name == "__init__.py" else f"{prefix}.{name[:-3]}"
                    yield module, os.path.join(parent, name)


def _imports_with_names(path: str) -> set[str]:
    """`_imports`, plus ``package.name`` for each ``from package import name``."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = _imports(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_cli_is_the_top_layer():
    """Nothing of the package imports `tfrs_logq.cli` but the CLI itself (and
    ``python -m``'s ``__main__``): its modules only parse flags and call the library."""
    modules = dict(_package_modules())
    assert "tfrs_logq.cli.app" in modules and "tfrs_logq.config" in modules
    offenders = sorted(
        (module, name) for module, path in modules.items()
        if not (module == "tfrs_logq.cli" or module.startswith("tfrs_logq.cli.")
                or module.endswith("__main__"))
        for name in _imports_with_names(path)
        if name == "tfrs_logq.cli" or name.startswith("tfrs_logq.cli."))
    assert not offenders, offenders


def test_the_readers_moved_below_training_keep_their_pipeline_names():
    """`read_split` and the Statistics readers live in the data layer now; their
    earlier module names are the same module objects."""
    import importlib

    for name in ("examples", "item_statistics"):
        old = importlib.import_module(f"tfrs_logq.pipelines.beam.{name}")
        assert old is importlib.import_module(f"tfrs_logq.pipelines.{name}")
    from tfrs_logq.pipelines.beam import load_item_statistics, read_split
    from tfrs_logq.pipelines.examples import read_split as moved_read_split
    from tfrs_logq.pipelines.item_statistics import load_item_statistics as moved_load

    assert read_split is moved_read_split and load_item_statistics is moved_load


# The README's layer table: every module of the package, and the layer it sits in. A
# module may import its own layer and lower ones only; a new module must be placed here.
LAYERS = {
    1: ("tfrs_logq._version", "tfrs_logq.proposal", "tfrs_logq.losses", "tfrs_logq.metrics",
        "tfrs_logq.stats", "tfrs_logq.atomic", "tfrs_logq.cache", "tfrs_logq.hostinfo"),
    2: ("tfrs_logq.sampling", "tfrs_logq.frequency", "tfrs_logq.config",
        "tfrs_logq.pipelines", "tfrs_logq.pipelines.datasets",
        "tfrs_logq.pipelines.interactions", "tfrs_logq.pipelines.splits",
        "tfrs_logq.pipelines.sequential", "tfrs_logq.pipelines.synthetic",
        "tfrs_logq.pipelines.manifest", "tfrs_logq.pipelines.examples",
        "tfrs_logq.pipelines.item_statistics"),
    3: ("tfrs_logq", "tfrs_logq.tasks", "tfrs_logq.objectives", "tfrs_logq.models",
        "tfrs_logq.lazy_adam", "tfrs_logq.native"),
    4: ("tfrs_logq.training", "tfrs_logq.callbacks", "tfrs_logq.run_directory",
        "tfrs_logq.trained", "tfrs_logq.step_checkpoint"),
    5: ("tfrs_logq.experiment", "tfrs_logq.demo", "tfrs_logq.diagnose", "tfrs_logq.study",
        "tfrs_logq.study_grid",
        "tfrs_logq.study_report", "tfrs_logq.pipelines.beam", "tfrs_logq.serving"),
    6: ("tfrs_logq.cli",),
}


def _layer(module: str) -> int:
    """The layer of ``module``: its own entry, else its closest listed package's
    (``tfrs_logq.serving.*`` are in 5, ``tfrs_logq.cli.*`` in 6)."""
    best = None
    for layer, names in LAYERS.items():
        for name in names:
            if module == name or (module.startswith(name + ".") and name != "tfrs_logq"):
                if best is None or len(name) > len(best[1]):
                    best = (layer, name)
    if best is None:
        raise AssertionError(f"{module} is not in LAYERS: place it in the layer table")
    return best[0]


def _package_modules() -> list[tuple[str, str]]:
    found = []
    for top, prefix in (("tfrs_logq", "tfrs_logq"), ("pipelines", "tfrs_logq.pipelines"),
                        ("serving", "tfrs_logq.serving")):
        for parent, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(parent, name), os.path.join(ROOT, top))
                parts = rel[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found.append((".".join([prefix, *parts]), os.path.join(parent, name)))
    return found


def _imported_modules(path: str) -> set[str]:
    """Every ``tfrs_logq`` module an import statement of ``path`` names (lazy ones
    too); ``from tfrs_logq import native`` names ``tfrs_logq.native``."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "tfrs_logq")
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and node.module.split(".")[0] == "tfrs_logq"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                spec_file = _source_file(candidate) if candidate.count(".") else ""
                is_module = (os.path.exists(spec_file) or os.path.isdir(spec_file[:-3]))
                found.add(candidate if is_module else node.module)
    return found


def test_every_module_imports_only_its_own_layer_or_lower_ones():
    modules = _package_modules()
    assert len(modules) > 60
    upward = []
    for module, path in modules:
        if module.startswith("tfrs_logq.native") and path.endswith(".cc"):
            continue
        own = _layer(module)
        for name in sorted(_imported_modules(path)):
            if _layer(name) > own:
                upward.append(f"{module} (layer {own}) imports {name} (layer {_layer(name)})")
    assert not upward, "\n".join(upward)


def test_the_layer_table_places_every_module_and_catches_an_upward_import(tmp_path):
    for module, _ in _package_modules():
        _layer(module)  # raises for a module missing from the table
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tfrs_logq.serving import export\n")
    assert _layer("tfrs_logq.losses") == 1
    assert any(_layer(n) == 5 for n in _imported_modules(str(bad)))
