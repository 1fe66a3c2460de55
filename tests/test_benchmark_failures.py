"""A benchmark whose measurement fails prints what it did measure and exits non-zero (never a silent gap)."""
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "spade_seq2seq.py"


def test_spade_seq2seq_fails_when_a_configuration_did_not_run(monkeypatch, capsys):
    import measurement  # scripts/benchmarks, on sys.path by the fixture below

    def fails(*args, **kwargs):
        raise subprocess.CalledProcessError(137, "child")

    monkeypatch.setattr(measurement, "in_subprocess", fails)
    monkeypatch.setattr(measurement, "child", fails)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--lengths", "64"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "not measured" in str(exit_info.value.code)
    assert "generation at 64 tokens" in str(exit_info.value.code)
    assert "did not run" in capsys.readouterr().out


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python SCRIPT` does
