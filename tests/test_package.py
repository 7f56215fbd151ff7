"""The package itself: what is installed (the library, not the lab) and the tf-keras
selection at import. Its public API: tests/test_public_api.py."""

import subprocess
import sys


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
    import typing

    from tfrs_logq.cli.app import COMMANDS

    names = {getattr(marker, "name", None) for command in typing.get_args(COMMANDS)
             for marker in command.__metadata__}
    assert "train" in names and not names & {"study", "experiment"}


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
