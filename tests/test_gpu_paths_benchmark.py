"""``gpu_paths.py`` runs end to end (on CPU, at its small sizes): it calls the other benchmark scripts' functions, so a
change to one of them that it does not follow fails here, not on a GPU session's few minutes."""
import runpy
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "gpu_paths.py"
WORKLOADS = ("MSSM encoder layer", "mssm_transducer encoder, 1 s, train", "mssm_transducer encoder, 1 s, eval",
             "MSSM masked-LM layer, 256 tokens", "S4 layer, 512 tokens", "SPADE LM training step, 512 tokens",
             "spade_t5_small training step, 512 source tokens")


def test_gpu_paths_prints_a_row_per_workload_on_cpu(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python SCRIPT` does
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--device", "cpu", "--repeats", "1"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and " ms" in line]
    for workload in WORKLOADS:
        assert any(row.startswith(f"| {workload}") for row in rows), f"no row for {workload}: {rows}"
    assert len(rows) == len(WORKLOADS), rows
