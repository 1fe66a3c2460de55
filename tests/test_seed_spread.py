"""scripts/seed_spread.sh (the recipe over several seeds) and scripts/check_learning.py (the learning guard), on
the five-utterance fixture with a tiny model."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fairseq import checkpoint_utils

import ssm_fairseq  # noqa: F401  (allow-lists what speech_transducer checkpoints hold)

from cli import BIN, REPO, run_ok
from librispeech_fixture import write_fixture

sys.path.insert(0, str(REPO / "scripts"))
import check_learning  # noqa: E402
import spread_by_test_size  # noqa: E402

pytestmark = pytest.mark.slow

TINY_MODEL = ("--encoder-layers 1 --encoder-embed-dim 32 --encoder-ffn-embed-dim 64 --ssm-heads 2 --ssm-state-size 4 "
              "--subsampler tr --predictor-embed-dim 16 --predictor-hidden-dim 16 --predictor-layers 1 --joint-dim 24")


def _env(corpus: Path, **extra: str) -> dict:
    return {**os.environ, "CORPUS_ROOT": str(corpus), "PYTHON_BIN": str(BIN), "TRAIN_SETS": "train-fixture",
            "VALID_SETS": "test-fixture", "EVAL_SETS": "test-fixture", "VOCAB_SIZE": "24", "MODEL_ARGS": TINY_MODEL,
            "MAX_EPOCH": "1", "AVERAGE_LAST": "1", "WARMUP_UPDATES": "2", "BEAM": "2", "OMP_NUM_THREADS": "1",
            "TRAIN_ARGS": "--batch-size 2 --required-batch-size-multiple 1 --num-workers 0", **extra}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("seed_spread"))


def test_seed_spread_trains_each_seed_and_summarises(corpus, tmp_path):
    work = tmp_path / "spread"
    out = run_ok(["bash", "scripts/seed_spread.sh", "--conf", "recipes/librispeech/conf/mini.sh", "--seeds", "3 7",
                  "--jobs", "2", "--work-dir", str(work)], env=_env(corpus))
    wers = {}
    for seed in (3, 7):
        checkpoint = work / f"seed{seed}/checkpoints/mssm_transducer/checkpoint_avg1.pt"
        state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
        assert state["cfg"].common.seed == seed
        assert state["cfg"].task.data == str(work / "data")  # one preparation shared by every seed
        row = (work / f"seed{seed}/wer_mssm_transducer.md").read_text().splitlines()[2]
        wers[seed] = float(row.strip("|").split("|")[1])
        assert re.search(rf"^\| {seed} \| mssm_transducer \(beam 2\) \| {wers[seed]:.2f} \|$", out, flags=re.M)
    assert not (work / "seed3/data").exists()
    values = sorted(wers.values())
    assert f"| mean | 2 seeds | {sum(values) / 2:.2f} |" in out
    assert f"| min | 2 seeds | {values[0]:.2f} |" in out and f"| max | 2 seeds | {values[1]:.2f} |" in out
    ratio = f"{values[1] / values[0]:.2f}" if values[0] > 0 else "-"
    assert f"| max / min | 2 seeds | {ratio} |" in out
    assert (work / "seed_spread.md").read_text() in out
    # the same WERs recomputed from the decodings' lines, and on the whole test set the same worst / best
    utterances = len((work / "data/test-fixture.tsv").read_text().splitlines()) - 1
    resampled = run_ok([sys.executable, "scripts/spread_by_test_size.py", str(work), "--subset", "test-fixture",
                        "--sizes", "1", str(utterances), "--draws", "20"])
    assert all(f"seed{seed} {wer:.2f}" in resampled for seed, wer in wers.items())
    if values[0] > 0:
        assert re.search(rf"^\| {utterances} \| {ratio} \| {ratio} \| ", resampled, flags=re.M), resampled

    # a seed whose LM stages (6-8) wrote their table beside stage 5's is summarised from stage 5's
    (work / "seed3/wer_mssm_transducer_lm_spade_lm.md").write_text("| LM weight | ILM weight | test-fixture WER % |\n")
    again = run_ok(["bash", "scripts/seed_spread.sh", "--seeds", "3 7", "--work-dir", str(work)], env=_env(corpus))
    assert again.count("exists, not re-run") == 2 and f"| min | 2 seeds | {values[0]:.2f} |" in again

    # other settings into the same directory would mix differently trained seeds in one summary: refused
    other = subprocess.run(["bash", "scripts/seed_spread.sh", "--seeds", "3 7 9", "--work-dir", str(work)],
                           capture_output=True, text=True, cwd=REPO, env=_env(corpus, MAX_EPOCH="2"))
    assert other.returncode == 2 and "was run with other settings" in other.stderr
    assert "> MAX_EPOCH=2" in other.stderr and not (work / "seed9").exists()


def test_seed_spread_fails_naming_the_seed_that_failed(corpus, tmp_path):
    env = _env(corpus, MODEL_ARGS=TINY_MODEL + " --ssm-heads 3")  # 32 channels in 3 heads: the model refuses
    result = subprocess.run(["bash", "scripts/seed_spread.sh", "--seeds", "5", "--work-dir", str(tmp_path / "w")],
                            capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode != 0
    assert "seed 5 failed" in result.stderr and "no summary" in result.stderr
    assert "| mean |" not in result.stdout


@pytest.mark.parametrize("args, message", [(["--seeds", "1 x"], "'x' is not a non-negative integer"),
                                           (["--jobs", "0"], "--jobs must be a positive integer")])
def test_seed_spread_refuses_bad_arguments(tmp_path, args, message):
    result = subprocess.run(["bash", "scripts/seed_spread.sh", *args, "--work-dir", str(tmp_path)],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and message in result.stderr


def test_learning_curve_is_read_from_fairseq_train_logs():
    log = ("2026-11-23 | INFO | dev | epoch 001 | valid on 'dev-mini' subset | loss 9.1 | rnnt_loss 4.431 | "
           "aux_ctc_loss 5.9 | dropped 0\n"
           "2026-11-23 | INFO | train | epoch 001 | loss 9.9 | rnnt_loss 5.0 | gnorm 11.2\n"
           "2026-11-23 | INFO | dev | epoch 002 | valid on 'dev-mini' subset | loss 7.1 | rnnt_loss 2.93 | dropped 0\n")
    assert check_learning.parse_curve(log) == {1: 4.431, 2: 2.93}


def test_check_learning_passes_on_its_own_record_and_fails_on_a_better_one(corpus, tmp_path):
    reference = tmp_path / "curve.tsv"
    env = _env(corpus)
    command = [sys.executable, "scripts/check_learning.py", "--epochs", "2", "--work-dir", str(tmp_path / "w"),
               "--reference", str(reference)]
    run_ok([*command, "--record"], env=env)
    recorded = check_learning.read_reference(reference)
    assert sorted(recorded) == [1, 2]

    out = run_ok(command, env=env)  # deterministic: the same curve again
    assert "learning check passed" in out
    for epoch, loss in recorded.items():
        assert f"| {epoch} | {loss:.3f} | {loss:.3f} |" in out

    reference.write_text("epoch\tdev_rnnt_loss\n" + "".join(f"{e}\t{loss / 2}\n" for e, loss in recorded.items()))
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode == 1 and "SLOWER" in result.stdout
    assert "learning is slower than the recorded curve at epoch(s) [1, 2]" in result.stderr


def test_check_learning_refuses_a_reference_shorter_than_the_epochs(tmp_path):
    reference = tmp_path / "curve.tsv"
    reference.write_text("epoch\tdev_rnnt_loss\n1\t4.0\n")
    result = subprocess.run([sys.executable, "scripts/check_learning.py", "--epochs", "3", "--reference",
                             str(reference), "--work-dir", str(tmp_path / "w")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and "has no loss for epoch(s) [2, 3]" in result.stderr


def _generate_output(path: Path, pairs: list[tuple[str, str]], printed_wer: float) -> None:
    """A ``generate-test-x.txt`` as fairseq-generate writes it: T- and D- lines per sample, then the WER line."""
    path.parent.mkdir(parents=True)
    lines = [f"T-{i}\t{ref}\nD-{i}\t-1.0\t{hyp}" for i, (ref, hyp) in enumerate(pairs)]
    path.write_text("\n".join(lines) + f"\nGenerate test-x with beam=4: WER: {printed_wer:.2f}\n")


def test_spread_by_test_size_recomputes_each_wer_and_refuses_one_that_differs(tmp_path, capsys):
    pairs = {"seed1": [("a b c d", "a b c d"), ("e f g h", "e f x h")],  # 1 error in 8 words
             "seed2": [("a b c d", "a x c"), ("e f g h", "e f g h")]}  # 2 errors in 8 words
    for seed, rows in pairs.items():
        errors = sum(spread_by_test_size.editdistance.eval(r.split(), h.split()) for r, h in rows)
        _generate_output(tmp_path / seed / "decode/m/test-x/generate-test-x.txt", rows, 100 * errors / 8)
    assert spread_by_test_size.main([str(tmp_path), "--subset", "test-x", "--sizes", "1", "2", "--draws", "50"]) == 0
    out = capsys.readouterr().out
    assert "seed1 12.50 seed2 25.00" in out and "| 2 | 2.00 | 2.00 | 0% |" in out
    assert re.search(r"^\| 1 \| (1\.00|inf) \|", out, flags=re.M)  # one utterance: one seed may score 0
    _generate_output(tmp_path / "seed3/decode/m/test-x/generate-test-x.txt", pairs["seed1"], 50.0)  # a wrong WER
    assert spread_by_test_size.main([str(tmp_path), "--subset", "test-x"]) == 1
    assert "WER recomputed from its lines is 12.50, the file says 50.00" in capsys.readouterr().err
