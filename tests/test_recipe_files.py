"""The shell entry points the README runs directly (recipes/*/run.sh, scripts/*.sh) are executable in git."""
from __future__ import annotations

import os
import shutil
import subprocess

from cli import REPO

ENTRY_POINTS = ("recipes/*/run.sh", "scripts/*.sh")


def _modes() -> dict[str, str]:
    """Path -> file mode of every entry point: git's index mode (``100755``: what a clone gets) in a checkout, else
    the working tree's (an unpacked release), as ``100755`` / ``100644``."""
    if shutil.which("git") is not None and (REPO / ".git").exists():
        listing = subprocess.run(["git", "ls-files", "--stage", "--", *ENTRY_POINTS], capture_output=True,
                                 text=True, cwd=REPO, check=True).stdout
        return {path: meta.split()[0] for meta, path in (line.split("\t", 1) for line in listing.splitlines())}
    return {path.relative_to(REPO).as_posix(): "100755" if os.access(path, os.X_OK) else "100644"
            for pattern in ENTRY_POINTS for path in REPO.glob(pattern)}


def test_entry_points_are_tracked():
    modes = _modes()
    assert {"recipes/librispeech/run.sh", "recipes/wikitext103/run.sh", "recipes/mlm/run.sh",
            "recipes/seq2seq/run.sh"} <= set(modes), sorted(modes)


def test_entry_points_are_executable_in_git():
    # a clone gets the index's mode: 100644 there means "Permission denied" for the README's commands
    not_executable = sorted(path for path, mode in _modes().items() if mode != "100755")
    assert not not_executable, f"not executable in git (git update-index --chmod=+x): {not_executable}"
