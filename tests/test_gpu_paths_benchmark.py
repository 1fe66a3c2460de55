"""``gpu_paths.py`` runs end to end (on CPU, at its small sizes, compiled rows through ``aot_eager``): it calls the
other benchmark scripts' functions, so a change to one of them that it does not follow fails here, not on a GPU
session's few minutes. The transducer encoders are built through their registered architectures, as on the GPU, but
with 2 encoder layers instead of 16 and 20: the calls are the same, and the CPU run takes 35 s of CPU instead of 50
(dynamo traces each compiled layer of its own)."""
import runpy
import sys
from pathlib import Path

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY

import ssm_fairseq  # noqa: F401  (registers the transducer architectures)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "gpu_paths.py"
WORKLOADS = ("MSSM encoder layer, 250 frames, training step",
             "mssm_transducer encoder, 1 s, batch 1, training step", "mssm_transducer encoder, 1 s, batch 1, inference",
             "mssm_transducer encoder, --max-tokens 400, 4 x 1 s, training step",
             "mssm_transducer encoder, --max-tokens 400, 4 x 1 s, inference",
             "MSSM masked-LM layer, 256 tokens, training step", "SPADE LM generation, context 256, per token",
             "spade_t5_small training step, 256 source tokens",
             "mssm_transducer encoder, --max-tokens 400, 4 x 1 s, training step, convolved chunk by chunk",
             "mssm_transducer encoder, --max-tokens 400, 4 x 1 s, inference, convolved chunk by chunk")


SHALLOW_ENCODER_LAYERS = 2


def _shallow(architecture: str):
    """``architecture``'s defaults, but ``SHALLOW_ENCODER_LAYERS`` encoder layers."""
    full = ARCH_CONFIG_REGISTRY[architecture]

    def shallow(args):
        args.encoder_layers = SHALLOW_ENCODER_LAYERS
        full(args)
    return shallow


def _run(monkeypatch, capsys, *arguments: str) -> list[str]:
    for architecture in ("mssm_transducer", "transformer_transducer"):
        monkeypatch.setitem(ARCH_CONFIG_REGISTRY, architecture, _shallow(architecture))
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python SCRIPT` does
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *arguments])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]


def test_gpu_paths_prints_a_row_per_workload_on_cpu(monkeypatch, capsys, worker_threads):
    rows = _run(monkeypatch, capsys, "--device", "cpu", "--repeats", "1", "--compile-backend", "aot_eager",
                "--budget-minutes", "60", *worker_threads)
    rows = [row for row in rows if " ms" in row]
    for workload in WORKLOADS:
        assert any(row.startswith(f"| {workload} |") for row in rows), f"no row for {workload}: {rows}"
    assert len(rows) == len(WORKLOADS), rows
    compiled = [row for row in rows if "compiled in" in row]
    assert [row.split(" |")[0][2:] for row in compiled] == list(WORKLOADS[:3]), compiled


def test_gpu_paths_dry_run_lists_the_gpu_sizes(monkeypatch, capsys):
    rows = _run(monkeypatch, capsys, "--device", "cuda", "--dry-run")  # touches no GPU
    recipe_batch = "| mssm_transducer encoder, --max-tokens 40000, 26 x 15 s, training step"
    assert any(row.startswith(recipe_batch) for row in rows)
    assert any(row.startswith("| SPADE LM generation, context 8192") for row in rows)
    assert len(rows) == 1 + len(WORKLOADS), rows  # the header and a row per workload


def test_convolved_chunk_by_chunk_adds_the_device_type_while_open(monkeypatch):
    """The chunked rows' switch: the GPU's device type joins ``CHUNKED_DEVICES`` and any batch is chunked, and both are
    restored, also after an error."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    gpu_paths = runpy.run_path(str(SCRIPT))
    from ssm_fairseq.ssm import batched_kernels

    before, fewest = batched_kernels.CHUNKED_DEVICES, batched_kernels.CHUNKED_MIN_POSITIONS
    with gpu_paths["convolved_chunk_by_chunk"]("cuda:0"):
        assert batched_kernels.CHUNKED_DEVICES == (*before, "cuda") and batched_kernels.CHUNKED_MIN_POSITIONS == 0
    assert (batched_kernels.CHUNKED_DEVICES, batched_kernels.CHUNKED_MIN_POSITIONS) == (before, fewest)
    with pytest.raises(KeyError), gpu_paths["convolved_chunk_by_chunk"]("cuda"):
        raise KeyError("a row failed")
    assert (batched_kernels.CHUNKED_DEVICES, batched_kernels.CHUNKED_MIN_POSITIONS) == (before, fewest)
