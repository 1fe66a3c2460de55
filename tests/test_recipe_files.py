"""The shell entry points the README runs directly (recipes/*/run.sh, scripts/*.sh) are executable in git."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from cli import REPO

ENTRY_POINTS = ("recipes/*/run.sh", "scripts/*.sh")


def _indexed_modes() -> dict[str, str]:
    """Path -> git file mode (e.g. ``100755``) of every tracked entry point."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listing = subprocess.run(["git", "ls-files", "--stage", "--", *ENTRY_POINTS], capture_output=True, text=True,
                             cwd=REPO, check=True).stdout
    modes = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        modes[path] = meta.split()[0]
    return modes


def test_entry_points_are_tracked():
    modes = _indexed_modes()
    assert {"recipes/librispeech/run.sh", "recipes/wikitext103/run.sh", "recipes/mlm/run.sh",
            "recipes/seq2seq/run.sh"} <= set(modes), sorted(modes)


def test_entry_points_are_executable_in_git():
    # a clone gets the index's mode: 100644 there means "Permission denied" for the README's commands
    not_executable = sorted(path for path, mode in _indexed_modes().items() if mode != "100755")
    assert not not_executable, f"not executable in git (git update-index --chmod=+x): {not_executable}"
