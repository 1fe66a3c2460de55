"""The package as a user installs it: a wheel built from the clone, installed into a directory of its own, used
from outside the clone (its console commands, ``python -m ssm_fairseq.user_dir`` and ``fairseq-train --user-dir``).

The wheel is installed with ``pip install --no-deps --target SITE`` (its dependencies are .venv's) and found
through ``PYTHONPATH=SITE``, which Python searches before .venv's editable install of the clone; every command
runs in a directory outside the clone, and the test checks that ``ssm_fairseq`` is imported from SITE.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from cli import BIN, REPO
from librispeech_fixture import write_fixture
from test_librispeech_recipe import TINY_MODEL

pytestmark = pytest.mark.slow

COMMANDS = {"ssm-prepare-librispeech": "ssm_fairseq.cli.prepare_librispeech",
            "ssm-average-checkpoints": "ssm_fairseq.cli.average_checkpoints",
            "ssm-export-onnx": "ssm_fairseq.cli.export_onnx",
            "ssm-serve": "ssm_fairseq.cli.serve",
            "ssm-prepare-lm-text": "ssm_fairseq.cli.prepare_lm_text",
            "ssm-transcribe": "ssm_fairseq.cli.transcribe",
            "ssm-plot-kernels": "ssm_fairseq.cli.plot_kernels",
            "ssm-lm-distance-ppl": "ssm_fairseq.cli.lm_distance_perplexity",
            "ssm-mlm-evidence-ppl": "ssm_fairseq.cli.mlm_evidence_perplexity",
            "ssm-mlm-reach": "ssm_fairseq.cli.mlm_reach",
            "ssm-seq2seq-attention": "ssm_fairseq.cli.seq2seq_attention"}


def run_in(directory: Path, cmd: list[str], env: dict) -> str:
    """Run ``cmd`` in ``directory``; fail the test with its output tail unless it exits 0 -> its stdout."""
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=directory, env=env)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(SITE the wheel is installed in, a working directory outside the clone, the environment that finds SITE)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy: building in the clone would write build/ there
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "exp", "build", "dist", "*.egg-info",
                                                                "__pycache__", ".pytest_cache"))
    python = str(BIN / "python")
    run_in(root, [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                  str(root / "dist"), str(source)], dict(os.environ))
    (wheel,) = (root / "dist").glob("ssm_fairseq-*.whl")
    modules = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    assert modules == {path.relative_to(source).as_posix() for path in (source / "ssm_fairseq").rglob("*.py")}
    site = root / "site"
    run_in(root, [python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
           dict(os.environ))
    outside = root / "outside"
    outside.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), OMP_NUM_THREADS="1")
    return site, outside, env


def test_the_wheel_is_imported_and_names_its_user_dir(installed):
    """Every module comes from SITE (.venv's editable install would supply one missing from the wheel)."""
    site, outside, env = installed
    imports = ("import sys, ssm_fairseq, ssm_fairseq.transcribe, ssm_fairseq.user_dir; "
               "import ssm_fairseq.cli.average_checkpoints, ssm_fairseq.cli.plot_kernels, "
               "ssm_fairseq.cli.prepare_librispeech; "
               "[print(m.__file__) for name, m in sys.modules.items() if name.split('.')[0] == 'ssm_fairseq']")
    files = [Path(line) for line in run_in(outside, [str(BIN / "python"), "-c", imports], env).splitlines()]
    assert len(files) > 20 and Path(site / "ssm_fairseq/asr/transducer/model.py") in files
    assert [file for file in files if not file.is_relative_to(site)] == [], f"modules not imported from {site}"
    user_dir = run_in(outside, [str(BIN / "python"), "-m", "ssm_fairseq.user_dir"], env).strip()
    assert user_dir == str(site / "ssm_fairseq")


def test_console_commands_load_the_installed_modules(installed):
    site, outside, env = installed
    check = ("import importlib.metadata as m; d = m.distribution('ssm_fairseq'); print(d.locate_file('')); "
             "[print(e.name, e.value, e.load().__module__, __import__('sys').modules[e.module].__file__) "
             "for e in d.entry_points if e.group == 'console_scripts']")
    location, *lines = run_in(outside, [str(BIN / "python"), "-c", check], env).splitlines()
    assert Path(location) == site
    found = {name: (value, module, Path(file)) for name, value, module, file in map(str.split, lines)}
    assert {name: value for name, (value, _, _) in found.items()} == {name: f"{module}:main"
                                                                      for name, module in COMMANDS.items()}
    for name, (_, module, file) in found.items():
        assert module == COMMANDS[name] and file.is_relative_to(site), (name, module, file)
        assert (site / "bin" / name).is_file()


def test_prepare_with_the_command_then_train_with_the_user_dir(installed):
    """The installed ``ssm-prepare-librispeech`` on the fixture corpus, then one update of ``fairseq-train``
    with ``--user-dir "$(python -m ssm_fairseq.user_dir)"``, all outside the clone."""
    site, outside, env = installed
    corpus = write_fixture(outside)
    run_in(outside, [str(site / "bin/ssm-prepare-librispeech"), "--librispeech-root", str(corpus), "--out", "data",
                     "--subsets", "train-fixture,test-fixture", "--vocab-size", "24", "--jobs", "1"], env)
    user_dir = run_in(outside, [str(BIN / "python"), "-m", "ssm_fairseq.user_dir"], env).strip()
    run_in(outside, [str(BIN / "fairseq-train"), "data", "--user-dir", user_dir, "--task", "speech_transducer",
                     "--train-subset", "train-fixture", "--valid-subset", "test-fixture", "--arch", "mssm_transducer",
                     *TINY_MODEL.split(), "--criterion", "transducer", "--optimizer", "adam", "--lr", "1e-3",
                     "--max-update", "1", "--batch-size", "2", "--required-batch-size-multiple", "1",
                     "--save-dir", "checkpoints", "--num-workers", "0", "--cpu"], env)
    assert (outside / "checkpoints/checkpoint_last.pt").is_file()
