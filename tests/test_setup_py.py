"""``setup.py`` beside ``pyproject.toml``: a shim that reads everything from ``pyproject.toml``.

``python setup.py --version`` prints the package's version, and an editable install still works with it present
(``tests/test_wheel.py`` builds and uses the wheel). Both run on a copy of the clone, which they write into.
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest

import ssm_fairseq
from cli import BIN, REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the clone without its build products."""
    copy = tmp_path_factory.mktemp("setup_py") / "source"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", "exp", "build", "dist", "*.egg-info",
                                                              "__pycache__", ".pytest_cache"))
    return copy


def run(cmd: list[str], cwd: Path) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def test_setup_py_declares_nothing_of_its_own():
    """One source of truth: setup.py calls ``setup()`` with no arguments."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert [ast.unparse(call) for call in calls] == ["setup()"]


def test_setup_py_prints_the_version(source):
    output = run([str(BIN / "python"), "setup.py", "--version"], cwd=source)
    assert output.strip().splitlines()[-1] == ssm_fairseq.__version__


def test_editable_install_with_setup_py_present(source, tmp_path):
    """``pip install -e`` of the copy into a prefix of its own: the package then resolves to the copy's sources,
    and its console commands are installed."""
    prefix = tmp_path / "prefix"
    # --ignore-installed: without it pip would first uninstall .venv's own install of the clone
    run([str(BIN / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--ignore-installed", "--prefix", str(prefix), "-e", str(source)], cwd=tmp_path)
    (site_packages,) = prefix.glob("lib/python*/site-packages")
    (dist_info,) = site_packages.glob("ssm_fairseq-*.dist-info")
    direct_url = json.loads((dist_info / "direct_url.json").read_text(encoding="utf-8"))
    assert direct_url["dir_info"] == {"editable": True} and direct_url["url"] == source.as_uri()
    assert (prefix / "bin" / "ssm-transcribe").is_file()
    # -I -S: without PYTHONPATH and .venv's site-packages (its editable install of the clone), only the prefix's
    locate = ("import importlib.util, site; site.addsitedir(%r); "
              "print(importlib.util.find_spec('ssm_fairseq').origin)" % str(site_packages))
    origin = run([str(BIN / "python"), "-I", "-S", "-c", locate], cwd=tmp_path).strip()
    assert Path(origin) == source / "ssm_fairseq" / "__init__.py"
    installed = run([str(BIN / "python"), "-m", "pip", "show", "--files", "ssm_fairseq"], cwd=tmp_path)
    assert "Location: " + str(BIN.parent) in installed, "the test's install replaced .venv's own"
