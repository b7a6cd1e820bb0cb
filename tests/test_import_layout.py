"""The checkout imports as installed (issue 41, item 5): no `__path__` additions, every module of
a built wheel is the checkout file of the same path under pyproject.toml's package-dir, and nothing
in a folder that is run as a file (pipelines/cli.py, pipelines/flex_template.py) shadows the
package or the standard library."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, *flags: str, cwd: str = "/") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RESCORE_CHECKOUT")}
    return subprocess.run([sys.executable, *flags, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _package_dir() -> dict[str, str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


@pytest.mark.slow
def test_every_module_of_the_wheel_imports_from_the_checkout_file_of_the_same_path(tmp_path):
    """Build the wheel from a copy of the tracked files, then ask this environment's import
    system (the editable install, nothing added to any __path__) where each of its modules is."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    if not any(files):
        pytest.skip("not a git checkout")
    src = tmp_path / "src"
    for f in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(src / os.path.dirname(f), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), src / f)
    built = _python(f"from setuptools import build_meta; print(build_meta.build_wheel({str(tmp_path / 'dist')!r}))",
                    cwd=str(src))
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = tmp_path / "dist" / built.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        modules = sorted(n[: -len(".py")].replace("/", ".").removesuffix(".__init__") for n in z.namelist()
                         if n.endswith(".py"))
    assert "rescore.pipelines.cli" in modules and "rescore.transforms.strategies" in modules
    where = _python(
        "import importlib.util, json, sys; "
        f"print(json.dumps({{m: importlib.util.find_spec(m).origin for m in {modules!r}}}))"
    )
    assert where.returncode == 0, where.stderr[-2000:]
    origins = json.loads(where.stdout)
    mapping = sorted(_package_dir().items(), key=lambda kv: -len(kv[0]))
    for module, origin in origins.items():
        package, folder = next((p, d) for p, d in mapping if module == p or module.startswith(p + "."))
        rest = module[len(package):].lstrip(".").replace(".", os.sep)
        want = os.path.join(ROOT, folder, rest)
        assert origin in (want + ".py", os.path.join(want, "__init__.py")), (module, origin)


def test_the_package_adds_nothing_to_its_path():
    done = _python("import rescore, os; print(rescore.__path__ == [os.path.dirname(rescore.__file__)])")
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_a_checkout_never_installed_says_so_in_one_line():
    """`python -S` (no site-packages, so no install) from the checkout's root: the folder's own
    rescore/ is found, its subpackages are not; one line says what to do."""
    done = subprocess.run([sys.executable, "-S", "-m", "rescore", "--help"], cwd=ROOT, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60)
    assert done.returncode == 1
    assert done.stderr == "rescore: error: this copy of Rescore is not installed: run `pip install -e .` in its folder first\n"


def test_no_module_in_a_folder_run_as_a_file_shadows_the_package_or_the_standard_library():
    """`python pipelines/cli.py` puts pipelines/ first on sys.path: a pipelines/rescore.py once
    shadowed the package there; a pipelines/json.py would shadow the standard library."""
    names = {f[: -len(".py")] for f in os.listdir(os.path.join(ROOT, "pipelines")) if f.endswith(".py")}
    assert "cli" in names and "job" in names
    assert names & (set(sys.stdlib_module_names) | {"rescore"}) == set()
