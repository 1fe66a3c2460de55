"""Running the repository's shell recipes and fairseq's commands from tests."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the environment's fairseq-* commands


def run_ok(cmd: list[str], **kwargs) -> str:
    """Run ``cmd`` in the repository root; fail the test with its output tail unless it exits 0."""
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, **kwargs)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr
