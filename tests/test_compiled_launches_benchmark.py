"""``compiled_launches.py`` runs end to end at tiny sizes (``aot_eager``, which generates no kernels, so that the test
compiles nothing with a C++ compiler): a row per layer and step, launch counts positive, the transformer at 1.00x in
both modes (counts are printed, never asserted against a figure)."""
import runpy
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "compiled_launches.py"


@pytest.mark.slow  # dynamo traces an MSSM layer's training and inference steps: 20-40 s
def test_compiled_launches_prints_eager_and_compiled_counts_per_layer_and_step(monkeypatch, capsys, worker_threads):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python SCRIPT` does
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--layers", "mssm", "--width", "16", "--frames", "12",
                                      "--backend", "aot_eager", "--top", "3", *worker_threads])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("| layer"))
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): [c.strip() for c in line.strip("|").split("|")]
            for line in out if line.startswith("| ") and line != header}
    assert set(rows) == {(layer, step) for layer in ("mssm", "transformer") for step in ("training", "inference")}
    for key, cells in rows.items():
        assert cells[2].isdigit() and int(cells[2]) > 0 and cells[4].isdigit() and int(cells[4]) > 0, (key, cells)
        assert cells[5] == "0", (key, cells)  # aot_eager runs ATen operators only
    for step in ("training", "inference"):
        assert rows[("transformer", step)][3] == rows[("transformer", step)][6] == "1.00x"
    # training runs the backward pass too; the MSSM layer's step runs more than the transformer layer's
    assert int(rows[("mssm", "training")][2]) > int(rows[("mssm", "inference")][2])
    assert int(rows[("mssm", "training")][2]) > int(rows[("transformer", "training")][2])
    assert any(line.startswith("mssm, training, compiled: ") for line in out)


def test_a_composite_operator_counts_once_and_a_conversion_that_copies_nothing_not_at_all():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from compiled_launches import count_launches
    finally:
        sys.path.remove(str(SCRIPT.parent))
    x, weight = torch.randn(4, 8), torch.randn(3, 8)
    counts = count_launches(lambda: torch.nn.functional.linear(x.to(torch.float32), weight).contiguous())
    assert counts == {"aten::linear": 1}  # linear's own mm counted once; to and contiguous did nothing
    counts = count_launches(lambda: x.to(torch.float64).t().contiguous())
    assert counts == {"aten::to": 1, "aten::contiguous": 1}  # a real conversion and a real copy
