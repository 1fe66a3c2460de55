"""``op_count.py`` runs end to end at tiny sizes: a row per workload and kernel path, operator counts positive
integers, the references at 1.00x (times are printed, never asserted)."""
import runpy
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "op_count.py"


def test_op_count_prints_counts_for_each_workload_and_path(monkeypatch, capsys, worker_threads):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python SCRIPT` does
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--layers", "mssm", "transformer", "--width", "32", "--frames",
                                      "16", "--architectures", "mssm_transducer", "transformer_transducer",
                                      "--seconds", "0.3", "--repeats", "1", "--top", "3", "--by-source", *worker_threads])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("| workload"))
    assert header.count("|") == 9
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line.strip("|").split("|")
            for line in out if line.startswith("| ") and line != header}
    assert set(rows) == {("mssm layer", "cpu"), ("mssm layer", "batched"), ("transformer layer", "-"),
                         ("mssm_transducer encoder", "cpu"), ("mssm_transducer encoder", "batched"),
                         ("transformer_transducer encoder", "-")}
    for key, cells in rows.items():
        training_ops, inference_ops = cells[2].strip(), cells[5].strip()
        assert training_ops.isdigit() and int(training_ops) > 0, (key, cells)
        assert inference_ops.isdigit() and int(inference_ops) > 0, (key, cells)
        assert int(training_ops) > int(inference_ops), (key, cells)
    assert rows[("transformer layer", "-")][3].strip() == "1.00x"
    assert rows[("transformer_transducer encoder", "-")][6].strip() == "1.00x"
    # the GPU's unbounded batched kernel generation dispatches no more operators than the CPU's bounded one (at these
    # sizes one generation per layer on both paths)
    assert int(rows[("mssm layer", "batched")][2]) <= int(rows[("mssm layer", "cpu")][2])
    assert int(rows[("mssm_transducer encoder", "batched")][2]) <= int(rows[("mssm_transducer encoder", "cpu")][2])
    assert any(line.startswith("mssm layer, cpu, training: ") for line in out)
    # by source: the files' counts add up to the row's total, and the MSSM system's own backward pass counts in its file
    by_source = next(line for line in out if line.startswith("mssm layer, cpu, training, by source: "))
    files = dict(part.rsplit(" ", 1) for part in by_source.split(": ", 1)[1].split(", "))
    assert sum(int(n) for n in files.values()) == int(rows[("mssm layer", "cpu")][2])
    assert int(files["ssm/mssm_system.py"]) > 18  # its 18 forward operators and its backward pass
