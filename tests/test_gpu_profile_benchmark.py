"""``gpu_profile.py`` runs end to end on CPU at its small sizes: a busy figure and an operator table per step, under
autocast too, so that a change to ``encoders.encoder_step`` that it does not follow fails here, not on a GPU
session's few minutes."""
import re
import runpy
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "gpu_profile.py"


def test_gpu_profile_prints_each_step_with_its_operators(monkeypatch, capsys, worker_threads):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python SCRIPT` does
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--device", "cpu", "--architectures", "transformer_transducer",
                                      "--batches", "one", "--modes", "eval", "--autocast", "none", "bf16",
                                      "--top", "3", "--repeats", "1", *worker_threads])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    headings = re.findall(r"^## transformer_transducer, eval, autocast (\w+), (\d+) x 1 s: wall [\d.]+ ms, "
                          r"busy [\d.]+ ms \(\d+% of wall\), \d+ operators$", out, flags=re.M)
    assert headings == [("none", "1"), ("bf16", "1")], out
    rows = re.findall(r"^\| aten::\S+ \| \d+ \| [\d.]+ \| \d+% \|$", out, flags=re.M)
    assert len(rows) == 2 * 3, out
