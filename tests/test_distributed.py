"""Multi-process training: fairseq's distributed data parallel path under torchrun, launched by the recipes' NPROC.

Each model trains twice through its recipe's training stage on CPU: with ``NPROC=2`` (torchrun, gloo, 2 ranks,
``--update-freq 1``) and in one process with ``--update-freq 2``. fairseq hands batch ``i`` of an epoch to rank
``i % 2``, and one process with ``--update-freq 2`` takes batches ``2k`` and ``2k+1`` into update ``k``: the two runs
see the same batches in every update (an odd batch count leaves rank 1 fairseq's dummy batch, which adds nothing).
Checked:

- both ranks end with identical parameters and buffers, bit for bit (every process applies the same all-reduced
  gradient); ``tests/rank_state_train.py`` stands in for ``fairseq-train`` (through ``PYTHON_BIN``) to write each
  rank's state, since fairseq saves checkpoints on rank 0 only;
- per update, the loss, the gradient norm (which would show a gradient summed instead of averaged over ranks) and
  the batch counts equal the single process's, and so does the final validation loss. fairseq logs losses and
  norms rounded to 3 decimals, so values that differ only by float reduction order (a two-rank all-reduce against
  gradient accumulation, 1 against 2 threads) may round apart by one unit of the last digit: tolerance 1e-3.
  A run where the ranks trained apart (world size 1 each) or the gradient scale were wrong is off by far more.

Dropout is 0 and SpecAugment off: fairseq reseeds torch with ``seed + update`` once per update, so rank 1 would
draw rank 0's dropout masks for its batch while the single process draws fresh ones for its second batch; the
comparison would measure dropout noise, not data parallelism. The transducer trains with the pruned RNN-T loss and
an auxiliary CTC head, so that the criterion's own parameters (the simple joiner) are data-parallel too.

fairseq 0.12's ``pytorch_ddp`` wrapper passes a GPU id to DistributedDataParallel, which refuses CPU modules: on
CPU the runs use ``--ddp-backend legacy_ddp`` (the WikiText-103 recipe's own choice), with ``--distributed-backend
gloo``.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils

import ssm_fairseq  # noqa: F401  (allow-lists what speech_transducer checkpoints hold)
from cli import BIN, REPO, run_ok
from librispeech_fixture import write_fixture

pytestmark = pytest.mark.slow

CPU_DDP = "--cpu --distributed-backend gloo --num-workers 0 --log-format json --log-interval 1"
TRANSDUCER = ("--encoder-layers 2 --encoder-embed-dim 32 --encoder-ffn-embed-dim 64 --ssm-heads 2 --ssm-state-size 4 "
              "--subsampler tr --tr-stride 2 --predictor-embed-dim 16 --predictor-hidden-dim 16 --predictor-layers 1 "
              "--joint-dim 24 --aux-ctc-every 1 --dropout 0 --predictor-dropout 0")
SPADE_LM = ("--decoder-layers 2 --decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 4 "
            "--attention-window 8 --ssm-state-size 8 --dropout 0 --max-update 4 --max-tokens 128 --warmup-updates 1 "
            "--no-epoch-checkpoints")
LOGGED_DIGITS = 1e-3  # fairseq rounds logged losses and gradient norms to 3 decimals


def _without_launch_settings() -> dict:
    """This process's environment without the recipes' launch variables (a test sets those it means)."""
    launch = ("NPROC", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {name: value for name, value in os.environ.items() if name not in launch}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory) -> Path:
    """PYTHON_BIN for the recipes: the environment's commands, with fairseq-train writing each rank's state."""
    directory = tmp_path_factory.mktemp("bin")
    commands = {name: f'exec "{BIN / name}" "$@"' for name in ("python", "torchrun", "fairseq-preprocess")}
    commands["fairseq-train"] = f'exec "{BIN / "python"}" "{REPO / "tests/rank_state_train.py"}" "$@"'
    for name, command in commands.items():
        (directory / name).write_text(f"#!/usr/bin/env bash\n{command}\n")
        (directory / name).chmod(0o755)
    return directory


def _train_log(out: str) -> tuple[list[dict], dict]:
    """The ``train_inner`` records of a ``--log-format json --log-interval 1`` run, and its last validation record."""
    records = [json.loads(m) for m in re.findall(r"\| train_inner \| (\{\"epoch\": .*\})$", out, flags=re.M)]
    valid = [json.loads(m) for m in re.findall(r"\| INFO \| (?!train)\S+ \| (\{\"epoch\": .*\})$", out, flags=re.M)]
    assert records and valid, out[-3000:]
    return records, valid[-1]


def _assert_same_training(ranks: str, single: str, updates: int) -> None:
    (ddp, ddp_valid), (one, one_valid) = _train_log(ranks), _train_log(single)
    assert [int(r["num_updates"]) for r in ddp] == [int(r["num_updates"]) for r in one] == list(range(1, updates + 1))
    for a, b in zip(ddp, one):
        assert (a["bsz"], a["wpb"]) == (b["bsz"], b["wpb"]), (a, b)  # the same batches met in the update
        for key in [key for key in a if key.endswith("loss")] + ["gnorm"]:
            assert math.isclose(float(a[key]), float(b[key]), abs_tol=LOGGED_DIGITS), (key, a, b)
        assert float(a["gnorm"]) > 0 and float(a["lr"]) > 0  # the parameters moved
    losses = [key for key in ddp_valid if key.endswith("loss")]
    assert losses and all(math.isclose(float(ddp_valid[k]), float(one_valid[k]), abs_tol=LOGGED_DIGITS) for k in losses)


def _assert_ranks_identical(save_dir: Path) -> None:
    ranks = [torch.load(save_dir / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert not (save_dir / "rank2.pt").exists()
    for part in ("model", "criterion"):
        assert ranks[0][part].keys() == ranks[1][part].keys()
        different = [name for name, value in ranks[0][part].items() if not torch.equal(value, ranks[1][part][name])]
        assert not different, f"{part}: {different}"
    last = checkpoint_utils.load_checkpoint_to_cpu(str(save_dir / "checkpoint_last.pt"))["model"]  # rank 0's save
    assert all(torch.equal(value, ranks[0]["model"][name]) for name, value in last.items())


def test_transducer_ranks_agree_and_match_one_process(tmp_path, bin_dir):
    """The LibriSpeech recipe's training stage with NPROC=2 (MASTER_ADDR/MASTER_PORT on the loopback), then with
    one process; the fixture's 5 utterances in batches of 2, 2 epochs: each epoch batches (0, 1) and (2, dummy).
    The data comes from the script of the recipe's stage 1, on one feature process (the stage starts one per core,
    which costs more here than 5 utterances' features)."""
    work = tmp_path / "work"
    run_ok([str(BIN / "python"), "scripts/prepare_librispeech.py", "--librispeech-root", str(write_fixture(tmp_path)),
            "--out", str(work / "data"), "--subsets", "train-fixture,test-fixture", "--combine-train", "train-all",
            "--train-subsets", "train-fixture,test-fixture", "--vocab-size", "24", "--no-specaugment", "--jobs", "1"])
    env = dict(_without_launch_settings(), WORK_DIR=str(work), PYTHON_BIN=str(bin_dir), TRAIN_NAME="train-all",
               VALID_SETS="test-fixture", MODEL_ARGS=TRANSDUCER, MAX_EPOCH="2", WARMUP_UPDATES="2", LR="1e-2",
               CRITERION_ARGS="--rnnt-backend pytorch --rnnt-loss pruned --prune-range 3 --prune-warmup-updates 2")
    recipe = ["bash", "recipes/librispeech/run.sh", "--conf", "recipes/librispeech/conf/mini.sh", "--stage", "2",
              "--stop-stage", "2"]
    train_args = f"--batch-size 2 {CPU_DDP} --ddp-backend legacy_ddp"
    ranks = run_ok(recipe,
                   env=dict(env, NPROC="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                            TRAIN_ARGS=f"{train_args} --update-freq 1"))
    assert "torchrun: 2 processes on this node, 2 in all" in ranks
    single_dir = tmp_path / "single"
    single = run_ok(recipe, env=dict(env, TRAIN_ARGS=f"{train_args} --update-freq 2 --save-dir {single_dir}"))
    assert "torchrun" not in single
    _assert_ranks_identical(work / "checkpoints/mssm_transducer")
    _assert_same_training(ranks, single, updates=4)
    assert not (single_dir / "rank1.pt").exists()


def test_spade_lm_ranks_agree_and_match_one_process(tmp_path, bin_dir):
    """The WikiText-103 recipe's training stage for spade_lm with NPROC=2 (torchrun --standalone: a free local
    port), then with one process: 4 updates of 2 x 2 blocks of 64 tokens, NAG at the recipe's lr 1.0."""
    env = dict(_without_launch_settings(), DATA_DIR=str(REPO / "recipes/wikitext103/sample"),
               WORK_DIR=str(tmp_path / "work"), PYTHON_BIN=str(bin_dir), TOKENS_PER_SAMPLE="64")
    recipe = ["bash", "recipes/wikitext103/run.sh", "--arch", "spade_lm", "--stop-stage", "2"]
    ranks = run_ok([*recipe, "--stage", "1"],
                   env=dict(env, NPROC="2", TRAIN_ARGS=f"{SPADE_LM} {CPU_DDP} --update-freq 1"))
    assert "torchrun: 2 processes on this node, 2 in all" in ranks
    single = run_ok([*recipe, "--stage", "2"],
                    env=dict(env, TRAIN_ARGS=f"{SPADE_LM} {CPU_DDP} --update-freq 2 --save-dir {tmp_path / 'single'}"))
    _assert_ranks_identical(tmp_path / "work/checkpoints/spade_lm_seed1")
    _assert_same_training(ranks, single, updates=4)


def _launch(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess:
    """``fairseq_train data --lr "1 2"`` from recipes/common.sh, with torchrun and fairseq-train replaced by
    commands that write the command line they were given, one argument a line, to ``argv.txt`` (the fake
    directory has no python to find the plugin with: ``USER_DIR`` is given)."""
    fake = tmp_path / "fake"
    fake.mkdir(exist_ok=True)
    for name in ("torchrun", "fairseq-train"):
        (fake / name).write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$0" "$@" > "{tmp_path}/argv.txt"\n')
        (fake / name).chmod(0o755)
    env = _without_launch_settings()
    script = f'set -euo pipefail; repo="{REPO}"; source recipes/common.sh; fairseq_train data --lr "1 2"'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=REPO,
                          env=dict(env, PYTHON_BIN=str(fake), USER_DIR=str(REPO / "ssm_fairseq"), **variables))


def _argv(tmp_path: Path) -> list[str]:
    return (tmp_path / "argv.txt").read_text().splitlines()


DISTRIBUTED = ["--distributed-init-method", "env://", "--distributed-no-spawn", "--distributed-rank", "-1"]


def test_one_process_runs_fairseq_train_itself(tmp_path):
    assert _launch(tmp_path).returncode == 0
    assert _argv(tmp_path) == [str(tmp_path / "fake/fairseq-train"), "data", "--lr", "1 2"]


def test_several_nodes_pass_the_rendezvous_to_torchrun(tmp_path):
    result = _launch(tmp_path, NPROC="4", NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.7", MASTER_PORT="29611")
    assert result.returncode == 0, result.stderr
    assert _argv(tmp_path) == [
        str(tmp_path / "fake/torchrun"), "--nproc_per_node", "4", "--nnodes", "2", "--node_rank", "1",
        "--master_addr", "10.0.0.7", "--master_port", "29611", "--no-python", str(tmp_path / "fake/fairseq-train"),
        "data", "--lr", "1 2", "--distributed-world-size", "8", *DISTRIBUTED]


def test_one_node_without_a_master_rendezvouses_on_a_free_port(tmp_path):
    assert _launch(tmp_path, NPROC="2").returncode == 0
    argv = _argv(tmp_path)
    assert argv[1:6] == ["--nproc_per_node", "2", "--nnodes", "1", "--standalone"]
    assert argv[-8:] == ["1 2", "--distributed-world-size", "2", *DISTRIBUTED]


@pytest.mark.parametrize("variables, message", [
    ({"NPROC": "0"}, "NPROC must be a positive integer, got '0'"),
    ({"NPROC": "two"}, "NPROC must be a positive integer, got 'two'"),
    ({"NNODES": "2", "MASTER_ADDR": "10.0.0.7"}, "NNODES=2 needs NODE_RANK (0 to 1), got ''"),
    ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "10.0.0.7"}, "NNODES=2 needs NODE_RANK (0 to 1), got '2'"),
    ({"NNODES": "2", "NODE_RANK": "1"}, "NNODES=2 needs MASTER_ADDR"),
])
def test_a_bad_launch_setting_stops_before_any_stage(tmp_path, variables, message):
    result = _launch(tmp_path, **variables)
    assert result.returncode == 2 and message in result.stderr
    assert not (tmp_path / "argv.txt").exists()
