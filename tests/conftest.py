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
torch.set_num_threads(min(THREADS, 2))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
