"""fairseq-train and fairseq-generate with --task speech_transducer, and the LibriSpeech recipe, on a fixture."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from omegaconf import OmegaConf

import ssm_fairseq  # noqa: F401  (allow-lists what speech_transducer checkpoints hold)

from cli import BIN, REPO, run_ok
from librispeech_fixture import TRANSCRIPTS, write_fixture

pytestmark = pytest.mark.slow

TINY_MODEL = ("--encoder-layers 1 --encoder-embed-dim 32 --encoder-ffn-embed-dim 64 --ssm-heads 2 --ssm-state-size 4 "
              "--subsampler tr --predictor-embed-dim 16 --predictor-hidden-dim 16 --predictor-layers 1 --joint-dim 24")


def _recipe_env(corpus: Path, work: Path) -> dict:
    return dict(os.environ, CORPUS_ROOT=str(corpus), WORK_DIR=str(work), PYTHON_BIN=str(BIN),
                TRAIN_SETS="train-fixture", VALID_SETS="test-fixture", EVAL_SETS="test-fixture", VOCAB_SIZE="24",
                MODEL_ARGS=TINY_MODEL, MAX_EPOCH="2", AVERAGE_LAST="2", WARMUP_UPDATES="2", BEAM="2",
                TRAIN_ARGS="--batch-size 2 --required-batch-size-multiple 1 --num-workers 0")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> tuple[Path, dict, str]:
    """Stages 0-5 of the recipe (the mini conf's settings, the fixture corpus, a tiny model, 2 epochs)."""
    root = tmp_path_factory.mktemp("librispeech")
    env = _recipe_env(write_fixture(root), root / "work")
    env["WORK_DIR"] = os.path.relpath(root / "work", REPO)  # a relative work directory, as the default one
    out = run_ok(["bash", "recipes/librispeech/run.sh", "--conf", "recipes/librispeech/conf/mini.sh"], env=env)
    return root / "work", env, out


def test_recipe_runs_every_stage(recipe):
    work, _, out = recipe
    assert "train-fixture is present, skipping its download" in out
    assert (work / "data/train-fixture.tsv").exists() and (work / "data/config.yaml").exists()
    checkpoints = work / "checkpoints/mssm_transducer"
    assert (checkpoints / "checkpoint2.pt").exists() and (checkpoints / "checkpoint_avg2.pt").exists()
    # the checkpoints name the data directory by its absolute path: transcription finds it from any directory
    cfg = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoints / "checkpoint_avg2.pt"))["cfg"]
    assert cfg.task.data == str(work / "data")
    decoded = (work / "decode/mssm_transducer/test-fixture/generate-test-fixture.txt").read_text()
    assert len(re.findall(r"^T-\d+\t", decoded, flags=re.M)) == sum(len(v) for v in TRANSCRIPTS["test-fixture"].values())
    assert re.search(r"^\| mssm_transducer \(beam 2\) \| [0-9.]+ \|$", out, flags=re.M)


def test_averaged_checkpoint_is_the_mean_of_the_last_epochs(recipe):
    work, _, _ = recipe
    checkpoints = work / "checkpoints/mssm_transducer"
    epochs = [checkpoint_utils.load_checkpoint_to_cpu(str(checkpoints / f"checkpoint{e}.pt"))["model"] for e in (1, 2)]
    averaged = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoints / "checkpoint_avg2.pt"))
    assert averaged["model"].keys() == epochs[1].keys()
    for name, value in averaged["model"].items():
        assert torch.allclose(value, (epochs[0][name].double() + epochs[1][name].double()).div(2).to(value.dtype))
    assert not torch.equal(epochs[0]["joiner.output.weight"], epochs[1]["joiner.output.weight"])


@pytest.mark.parametrize("last", ["0", "-3"])
def test_averaging_refuses_a_count_below_one(recipe, tmp_path, last):
    work, _, _ = recipe
    result = subprocess.run([sys.executable, "scripts/average_checkpoints.py", "--checkpoint-dir",
                             str(work / "checkpoints/mssm_transducer"), "--last", last, "--output",
                             str(tmp_path / "avg.pt")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and f"--last must be at least 1, got {last}" in result.stderr
    assert not (tmp_path / "avg.pt").exists()


def test_recipe_restarts_at_a_stage(recipe):
    work, env, _ = recipe
    out = run_ok(["bash", "recipes/librispeech/run.sh", "--conf", "recipes/librispeech/conf/mini.sh", "--stage", "5"],
               env=env)
    assert "stage 5" in out and "stage 4" not in out
    assert (work / "wer_mssm_transducer.md").read_text().splitlines()[0] == "| model | test-fixture WER % |"


def test_language_model_stages_train_an_lm_and_decode_with_fusion(recipe):
    """Stages 6-8: LM text and the bigram of the training transcripts, a tiny spade_lm, then stage 4's search at 2 LM
    weights, and with LODR at the weight above 0 (none at LM weight 0), each at 2 blank penalties; weight 0 is stage
    4's search exactly (the same hypotheses), the table has a row per triple and repeats the row chosen on the first
    set. The grid's own options in DECODE_ARGS are refused."""
    work, env, _ = recipe
    env = dict(env, LM_MODEL_ARGS="--decoder-layers 1 --decoder-embed-dim 16 --decoder-ffn-embed-dim 32 "
                                  "--decoder-attention-heads 2 --attention-window 4 --ssm-state-size 4",
               LM_TRAIN_ARGS="--sample-break-mode eos --tokens-per-sample 1024 --batch-size 2 --lr 1e-3 "
                             "--max-update 4 --num-workers 0", LM_WEIGHTS="0 0.5", ILM_WEIGHTS="0 2",
               BLANK_PENALTIES="0 5")
    out = run_ok(["bash", "recipes/librispeech/run.sh", "--conf", "recipes/librispeech/conf/mini.sh", "--stage", "6",
                  "--stop-stage", "8"], env=env)
    assert "stage 4" not in out and (work / "checkpoints/lm_spade_lm/checkpoint_best.pt").is_file()
    assert (work / "lm/bigram.json").is_file()
    table = (work / "wer_mssm_transducer_lm_spade_lm.md").read_text().splitlines()
    assert table[0] == "| LM weight (spade_lm) | ILM weight (LODR) | blank penalty | test-fixture WER % |"
    rows = [[cell.strip() for cell in row.strip("|").split("|")] for row in table[2:]]
    assert [row[:3] for row in rows[:-1]] == [["0", "0", "0"], ["0", "0", "5"], ["0.5", "0", "0"], ["0.5", "0", "5"],
                                              ["0.5", "2", "0"], ["0.5", "2", "5"]]
    best = min(rows[:-1], key=lambda row: float(row[3]))  # the first of the lowest, as min() picks
    assert rows[-1] == [f"chosen on test-fixture: {best[0]}", *best[1:]]
    hypotheses = {}
    for name in ("test-fixture", "lm_spade_lm_0/test-fixture", "lm_spade_lm_0.5/test-fixture",
                 "lm_spade_lm_0.5_ilm_2/test-fixture", "lm_spade_lm_0.5_bp_5/test-fixture",
                 "lm_spade_lm_0.5_ilm_2_bp_5/test-fixture"):
        decoded = (work / f"decode/mssm_transducer/{name}/generate-test-fixture.txt").read_text()
        hypotheses[name] = sorted(re.findall(r"^H-\d+\t.*$", decoded, flags=re.M))
    assert hypotheses["lm_spade_lm_0/test-fixture"] == hypotheses["test-fixture"]
    assert hypotheses["lm_spade_lm_0.5/test-fixture"] != hypotheses["test-fixture"]  # fused scores
    assert hypotheses["lm_spade_lm_0.5_ilm_2/test-fixture"] != hypotheses["lm_spade_lm_0.5/test-fixture"]  # LODR
    assert hypotheses["lm_spade_lm_0.5_bp_5/test-fixture"] != hypotheses["lm_spade_lm_0.5/test-fixture"]  # penalty
    assert hypotheses["lm_spade_lm_0.5_ilm_2_bp_5/test-fixture"] != hypotheses["lm_spade_lm_0.5_ilm_2/test-fixture"]

    # refused before any stage runs (here stage 7's training would come first)
    for decode_args, flag in (("--beam 2 --blank-penalty 1", "--blank-penalty"), ("--lm-weight=0.3", "--lm-weight"),
                              ("--ilm-path x.json --nbest 1", "--ilm-path")):
        refused = subprocess.run(["bash", "recipes/librispeech/run.sh", "--conf", "recipes/librispeech/conf/mini.sh",
                                  "--stage", "7", "--stop-stage", "8"], capture_output=True, text=True, cwd=REPO,
                                 env=dict(env, DECODE_ARGS=decode_args))
        assert refused.returncode == 2 and f"DECODE_ARGS sets {flag}," in refused.stderr
        assert "stage 7" not in refused.stdout + refused.stderr
    # a grid without a row to decode fails, naming the grid, and leaves the table of the last run as it was
    empty = subprocess.run(["bash", "recipes/librispeech/run.sh", "--conf", "recipes/librispeech/conf/mini.sh",
                            "--stage", "8", "--stop-stage", "8"], capture_output=True, text=True, cwd=REPO,
                           env=dict(env, LM_WEIGHTS="0", ILM_WEIGHTS="2"))
    assert empty.returncode == 1 and "stage 8 decoded nothing" in empty.stderr and "ILM_WEIGHTS='2'" in empty.stderr
    assert (work / "wer_mssm_transducer_lm_spade_lm.md").read_text().splitlines() == table


def test_recipe_names_a_missing_subset(tmp_path):
    env = _recipe_env(tmp_path / "nowhere", tmp_path / "work")
    result = subprocess.run(["bash", "recipes/librispeech/run.sh", "--conf", "recipes/librispeech/conf/mini.sh",
                             "--stop-stage", "0"], capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode != 0 and "missing subset" in result.stderr and "train-fixture" in result.stderr


def test_fairseq_train_then_generate_with_beam_search(recipe, tmp_path):
    """The CLIs directly: 3 updates, then beam 2 with 2-best lists, alignments and WER, into --results-path."""
    work, _, _ = recipe
    data = work / "data"
    run_ok([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
          "--train-subset", "train-fixture", "--valid-subset", "test-fixture", "--arch", "mssm_transducer",
          *TINY_MODEL.split(), "--criterion", "transducer", "--optimizer", "adam", "--lr", "1e-3",
          "--lr-scheduler", "warmup_hold_exp_decay", "--warmup-updates", "2", "--max-update", "3",
          "--batch-size", "2", "--required-batch-size-multiple", "1", "--save-dir", str(tmp_path / "ckpt"),
          "--num-workers", "0", "--cpu"])
    run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
          "--path", str(tmp_path / "ckpt/checkpoint_last.pt"), "--gen-subset", "test-fixture", "--beam", "2",
          "--nbest", "2", "--scoring", "wer", "--post-process", "sentencepiece", "--max-tokens", "10000",
          "--print-alignment", "hard", "--results-path", str(tmp_path / "decode"), "--cpu"])
    decoded = (tmp_path / "decode/generate-test-fixture.txt").read_text()
    targets = dict(re.findall(r"^T-(\d+)\t(.*)$", decoded, flags=re.M))
    assert sorted(targets.values()) == ["a cat ran on the mat", "the dog sat in the park"]  # words, not pieces
    hypotheses = re.findall(r"^D-(\d+)\t(\S+)\t", decoded, flags=re.M)
    assert sorted(i for i, _ in hypotheses) == sorted(list(targets) * 2)  # --nbest 2
    label_scores = re.findall(r"^P-\d+\t(.*)$", decoded, flags=re.M)
    alignments = re.findall(r"^A-\d+\t(.*)$", decoded, flags=re.M)
    assert len(alignments) == len(label_scores) == 4
    for scores, alignment in zip(label_scores, alignments):  # frame-position pairs: one per label, frames in order
        pairs = [tuple(map(int, pair.split("-"))) for pair in alignment.split()]
        assert [position for _, position in pairs] == list(range(len(scores.split()) - 1))  # P- also scores </s>
        assert [frame for frame, _ in pairs] == sorted(frame for frame, _ in pairs)
    assert re.search(r"^Generate test-fixture with beam=2: WER: [0-9.]+$", decoded, flags=re.M)


def test_fairseq_train_with_the_pruned_rnnt_loss(recipe, tmp_path):
    """--rnnt-loss pruned through fairseq-train: both losses logged, the trivial joiner saved with the criterion,
    and the checkpoint decodes."""
    work, _, _ = recipe
    data = work / "data"
    out = run_ok([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
                  "--train-subset", "train-fixture", "--valid-subset", "test-fixture", "--arch", "mssm_transducer",
                  *TINY_MODEL.split(), "--criterion", "transducer", "--rnnt-loss", "pruned", "--prune-range", "4",
                  "--prune-warmup-updates", "2", "--optimizer", "adam", "--lr", "1e-3", "--max-update", "3",
                  "--batch-size", "2", "--required-batch-size-multiple", "1", "--save-dir", str(tmp_path / "ckpt"),
                  "--num-workers", "0", "--cpu", "--log-interval", "1", "--log-format", "simple"])
    assert re.search(r"simple_loss[ =]+[0-9.]+", out) and re.search(r"rnnt_loss[ =]+[0-9.]+", out)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "ckpt/checkpoint_last.pt"))
    assert {"simple_joiner.encoder_proj.weight", "simple_joiner.predictor_proj.weight"} <= set(state["criterion"])
    run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--path", str(tmp_path / "ckpt/checkpoint_last.pt"), "--gen-subset", "test-fixture", "--beam", "2",
            "--scoring", "wer", "--max-tokens", "10000", "--cpu"])


def test_a_split_named_train_is_decoded_whole_and_unaugmented(recipe, tmp_path):
    """fairseq calls any split whose name starts with "train" a training split (SpecAugment, shuffling, batches
    dropped to a multiple of 8); the task calls so only the --train-subset that fairseq-train trains on."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    work, _, _ = recipe
    data, checkpoint = work / "data", work / "checkpoints/mssm_transducer/checkpoint_avg2.pt"
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer", "--train-subset", "train-fixture",
        "--arch", "mssm_transducer", "--criterion", "transducer", "--optimizer", "adam", "--lr", "1e-3"])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("train-fixture", combine=True)  # as fairseq-train's trainer loads its training data
    assert task.dataset("train-fixture").is_train_split
    task.load_dataset("train-fixture")  # as fairseq-generate and fairseq-validate load any split
    assert not task.dataset("train-fixture").is_train_split
    decodes = []
    for run in range(2):
        run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
                "--path", str(checkpoint), "--gen-subset", "train-fixture", "--beam", "2", "--scoring", "wer",
                "--max-tokens", "10000", "--results-path", str(tmp_path / f"decode{run}"), "--cpu"])
        decodes.append((tmp_path / f"decode{run}/generate-train-fixture.txt").read_text())
    assert len(re.findall(r"^T-\d+\t", decodes[0], flags=re.M)) == sum(map(len, TRANSCRIPTS["train-fixture"].values()))
    assert re.findall(r"^H-.*$", decodes[0], flags=re.M) == re.findall(r"^H-.*$", decodes[1], flags=re.M)


@pytest.mark.parametrize("beam", ["1", "2"])
def test_all_blank_decodes_score_with_the_default_bleu(recipe, tmp_path, beam):
    """An early checkpoint that emits only blanks: fairseq's default --scoring bleu (a C scorer that crashed on
    an empty hypothesis) scores it, and every utterance is printed with an empty hypothesis."""
    work, _, _ = recipe
    state = checkpoint_utils.load_checkpoint_to_cpu(str(work / "checkpoints/mssm_transducer/checkpoint_avg2.pt"))
    blank = 0  # the dictionary's <s>
    state["model"]["joiner.output.bias"][blank] = 1e4
    state["cfg"] = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)  # as fairseq stores it
    torch.save(state, tmp_path / "blank.pt")
    out = run_ok([str(BIN / "fairseq-generate"), str(work / "data"), "--user-dir", "ssm_fairseq", "--task",
                  "speech_transducer", "--path", str(tmp_path / "blank.pt"), "--gen-subset", "test-fixture",
                  "--beam", beam, "--max-tokens", "10000", "--cpu"])
    hypotheses = re.findall(r"^H-\d+\t(\S+)\t(.*)$", out, flags=re.M)
    assert len(hypotheses) == sum(map(len, TRANSCRIPTS["test-fixture"].values()))
    assert all(text == "" for _, text in hypotheses)
    assert "BLEU4 = 0.00" in out


def test_fairseq_train_names_a_manifest_row_whose_features_are_missing(recipe, tmp_path):
    work, _, _ = recipe
    data = tmp_path / "data"
    shutil.copytree(work / "data", data)
    config = (data / "config.yaml").read_text()  # fairseq reads the features under audio_root: the copy's own
    (data / "config.yaml").write_text(config.replace(str(work / "data"), str(data)))
    rows = (data / "train-fixture.tsv").read_text().splitlines()
    utterance, features = rows[2].split("\t")[:2]
    (data / features).unlink()
    result = subprocess.run([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task",
                             "speech_transducer", "--train-subset", "train-fixture", "--valid-subset", "test-fixture",
                             "--arch", "mssm_transducer", *TINY_MODEL.split(), "--criterion", "transducer",
                             "--optimizer", "adam", "--lr", "1e-3", "--max-update", "1", "--batch-size", "2", "--save-dir",
                             str(tmp_path / "ckpt"), "--num-workers", "0", "--cpu"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode != 0
    assert f"train-fixture.tsv:3: utterance '{utterance}': feature file" in result.stderr
    assert not (tmp_path / "ckpt/checkpoint_last.pt").exists()


def test_every_training_utterance_is_batched_in_every_epoch(recipe, tmp_path):
    """fairseq batches by --max-tokens with --required-batch-size-multiple 8 by dropping what does not fill a
    multiple; the task batches every utterance, training split included."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    work, _, _ = recipe
    data = tmp_path / "data"
    shutil.copytree(work / "data", data)
    header, *rows = (data / "train-fixture.tsv").read_text().splitlines()
    many = [f"copy{i}-{row}" for i in range(17) for row in rows]  # 51 utterances
    (data / "train-many.tsv").write_text("\n".join([header, *many]) + "\n")
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer", "--train-subset", "train-many",
        "--arch", "mssm_transducer", "--criterion", "transducer", "--optimizer", "adam", "--lr", "1e-3"])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("train-many", combine=True)
    dataset = task.dataset("train-many")
    frames = int(rows[0].split("\t")[2])
    iterator = task.get_batch_iterator(dataset, max_tokens=10 * frames, required_batch_size_multiple=8, seed=1)
    for epoch in (1, 2):
        seen = [i for batch in iterator.next_epoch_itr(shuffle=True) for i in batch["id"].tolist()]
        assert sorted(seen) == list(range(len(many))), f"epoch {epoch}"


def test_modified_search_with_a_blank_penalty_through_fairseq_generate(recipe, tmp_path):
    work, _, _ = recipe
    out = run_ok([str(BIN / "fairseq-generate"), str(work / "data"), "--user-dir", "ssm_fairseq", "--task",
                  "speech_transducer", "--path", str(work / "checkpoints/mssm_transducer/checkpoint_avg2.pt"),
                  "--gen-subset", "test-fixture", "--beam", "4", "--search", "modified", "--blank-penalty", "0.5",
                  "--print-alignment", "hard", "--scoring", "wer", "--max-tokens", "10000", "--cpu"])
    assert len(re.findall(r"^H-\d+\t", out, flags=re.M)) == sum(map(len, TRANSCRIPTS["test-fixture"].values()))
    for alignment in re.findall(r"^A-\d+\t(.*)$", out, flags=re.M):  # one label per frame at most
        frames = [int(pair.split("-")[0]) for pair in alignment.split()]
        assert len(frames) == len(set(frames))
    assert re.search(r"WER: [0-9.]+", out)


def _train_and_decode_the_training_split(data: Path, save_dir: Path, updates: int) -> float:
    run_ok([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--train-subset", "train-fixture", "--valid-subset", "test-fixture", "--arch", "mssm_transducer",
            *TINY_MODEL.split(), "--dropout", "0", "--predictor-dropout", "0", "--criterion", "transducer",
            "--rnnt-backend", "pytorch", "--optimizer", "adam", "--lr", "1e-2", "--lr-scheduler",
            "warmup_hold_exp_decay", "--warmup-updates", "5", "--max-update", str(updates), "--batch-size", "3",
            "--required-batch-size-multiple", "1", "--save-dir", str(save_dir), "--num-workers", "0", "--cpu",
            "--no-epoch-checkpoints", "--disable-validation"])
    out = run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
                  "--path", str(save_dir / "checkpoint_last.pt"), "--gen-subset", "train-fixture", "--beam", "2",
                  "--scoring", "wer", "--post-process", "sentencepiece", "--max-tokens", "10000", "--cpu"])
    return float(re.search(r"^Generate train-fixture with beam=2: WER: ([0-9.]+)$", out, flags=re.M).group(1))


def test_the_transducer_learns_its_training_utterances(recipe, tmp_path):
    """The recipe's 2 epochs on 3 utterances of tones teach nothing a WER could show; 150 updates make the tiny
    model transcribe its training utterances (measured: WER 0 after 120, 150, 180 and 300 updates, 60 after 60),
    which 1 update cannot (measured 100)."""
    work, _, _ = recipe
    assert _train_and_decode_the_training_split(work / "data", tmp_path / "one", 1) >= 80
    assert _train_and_decode_the_training_split(work / "data", tmp_path / "trained", 150) <= 20
