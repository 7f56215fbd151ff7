"""The package itself (`tfrs_logq/__init__.py`): its documented public API, and the
tf-keras selection at import."""

import subprocess
import sys

import pytest

import tfrs_logq

# The documented public API: each name and the module that defines it.
PUBLIC_API = {
    "CORRECTIONS": "tfrs_logq.losses",
    "CorrectedRetrieval": "tfrs_logq.tasks",
    "CountMinSketch": "tfrs_logq.frequency",
    "ExactFrequency": "tfrs_logq.frequency",
    "InBatchSampler": "tfrs_logq.sampling",
    "MixedSampler": "tfrs_logq.sampling",
    "SampledNegatives": "tfrs_logq.sampling",
    "StreamingFrequency": "tfrs_logq.frequency",
    "UniformSampler": "tfrs_logq.sampling",
    "sampled_softmax_loss": "tfrs_logq.losses",
}
PUBLIC_MODULES = ("frequency", "losses", "sampling", "tasks")


def test_public_api_names_import():
    """`__all__` is the hand-written list, and every name is the object its module defines."""
    import importlib
    import types

    assert sorted(tfrs_logq.__all__) == sorted([*PUBLIC_API, *PUBLIC_MODULES, "__version__"])
    for name, module_name in PUBLIC_API.items():
        module = importlib.import_module(module_name)
        obj = getattr(tfrs_logq, name)
        assert obj is getattr(module, name), name
        if isinstance(obj, (type, types.FunctionType)):
            assert obj.__module__ == module_name, (name, obj.__module__)
    for name in PUBLIC_MODULES:
        assert getattr(tfrs_logq, name) is importlib.import_module(f"tfrs_logq.{name}")
    from tfrs_logq._version import __version__

    assert tfrs_logq.__version__ == __version__ and __version__.count(".") >= 2
    assert tfrs_logq.CORRECTIONS == ("none", "logq-tfrs", "logq-official", "corrected")
    with pytest.raises(AttributeError):
        tfrs_logq.no_such_name  # noqa: B018


def test_every_package_directory_is_installed():
    """A non-editable install holds every package: each directory with an `__init__.py`
    under the installed trees is in pyproject's `packages`, mapped to that directory (a
    package left out imports from a checkout but not from a wheel)."""
    import os
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    package_dir = setuptools.get("package-dir", {})

    def directory(package: str) -> str:
        parts = package.split(".")
        for cut in range(len(parts), 0, -1):
            base = ".".join(parts[:cut])
            if base in package_dir:
                return os.path.join(package_dir[base], *parts[cut:])
        return os.path.join(*parts)

    listed = {directory(package): package for package in setuptools["packages"]}
    found = set()
    for tree in sorted(set(package_dir.values()) | {"tfrs_logq"}):
        for path, _, files in os.walk(os.path.join(root, tree)):
            if "__init__.py" in files and "__pycache__" not in path:
                found.add(os.path.relpath(path, root))
    assert found, "no package directories found"
    assert sorted(found - set(listed)) == [], "packages missing from pyproject.toml"
    assert sorted(set(listed) - found) == [], "packages listed without a directory"


# The lab's modules (lab/: the experiments behind the findings), which were in tfrs_logq,
# and the retired TensorFlow synthetic study's.
LAB_MODULES = ("study", "study_grid", "study_report", "experiment")


def test_the_lab_is_not_installed(tmp_path):
    """pyproject's packages hold the library and the commands a user runs, not the lab: no
    ``lab`` package, and the package laid out as installed (tools/installed_layout.py, what
    pyproject's package-dir maps) has no study or experiment module and no lab commands."""
    import os
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    assert [p for p in setuptools["packages"] if not p.startswith("tfrs_logq")] == []
    assert all(not d.startswith("lab") for d in setuptools.get("package-dir", {}).values())
    subprocess.run([sys.executable, os.path.join(root, "tools", "installed_layout.py"),
                    str(tmp_path)], check=True)
    assert sorted(os.listdir(tmp_path)) == ["tfrs_logq"]
    modules = {os.path.relpath(os.path.join(path, name), tmp_path)
               for path, _, files in os.walk(tmp_path) for name in files
               if name.endswith(".py")}
    assert len(modules) > 50, modules  # the whole package was laid out
    assert sorted(m for m in modules if os.path.basename(m)[:-3] in LAB_MODULES) == []
    from tfrs_logq.cli.app import COMMANDS

    assert [c for c in COMMANDS if c[0][0] in ("study", "experiment")] == []


def _fresh_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items() if k != "TF_USE_LEGACY_KERAS"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)


def test_import_selects_tf_keras_even_after_tensorflow_if_keras_untouched():
    proc = _fresh_python("import tensorflow as tf\nimport tfrs_logq\n"
                         "print(tf.keras.__name__ if hasattr(tf.keras, '__name__') else '')")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tf_keras" in proc.stdout


def test_import_after_keras3_was_loaded_fails_with_instructions():
    proc = _fresh_python("import tensorflow as tf\n_ = tf.keras.layers\nimport tfrs_logq\n")
    assert proc.returncode != 0
    assert "TF_USE_LEGACY_KERAS=1" in proc.stderr and "Keras 3" in proc.stderr
