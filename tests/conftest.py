import os

import pytest
import torch

# `make test` runs the suite in two pytest-xdist workers; each then takes its share of the cores, and so do the
# programs it starts (fairseq-train, the recipes), so that two workers' PyTorch threads do not fight over them.
# A module that needs another count sets it in a fixture of its own (tests/test_transcribe.py).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, (os.cpu_count() or 1) // WORKERS)
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
TORCH_THREADS = min(THREADS, 2)
torch.set_num_threads(TORCH_THREADS)


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
    # a script run in this process (runpy) sets its own thread count: it must not carry over to the tests after it
    torch.set_num_threads(TORCH_THREADS)


@pytest.fixture
def worker_threads() -> list[str]:
    """``--threads`` for a benchmark script run in this worker: the worker's share of the cores. Two workers' scripts
    asking for both cores of a 2-core machine took 1.9x the time of the two asking for one each."""
    return ["--threads", str(TORCH_THREADS)]
