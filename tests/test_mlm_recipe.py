"""The masked-LM recipe through fairseq's CLIs on the generated long-document sample, with small models."""
from __future__ import annotations

import os
import re
import shutil
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pytest

from cli import BIN, REPO, run_ok

pytestmark = pytest.mark.slow

ARCHS = ("mssm_roberta_base", "local_roberta_base")


def recipe_env(work: Path, **extra) -> dict:
    return dict(os.environ, WORK_DIR=str(work), PYTHON_BIN=str(BIN), MAX_UPDATE="30", FINETUNE_MAX_EPOCH="5",
                TRAIN_ARGS="--cpu --num-workers 0 --no-epoch-checkpoints", VALID_ARGS="--cpu",
                FINETUNE_ARGS="--cpu --num-workers 0", **extra)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> tuple[Path, str]:
    """Every stage: sample, SentencePiece, preprocess, pre-train 30 updates at 4096 tokens, validate, fine-tune;
    with SEED=2, so that training draws differ from the evaluation's masks (seed 1)."""
    work = tmp_path_factory.mktemp("mlm")
    out = run_ok(["bash", "recipes/mlm/run.sh", "--conf", "recipes/mlm/conf/sample.sh"],
                 env=recipe_env(work, SEED="2"))
    return work, out


def test_the_sample_documents_are_long(recipe):
    work, _ = recipe
    documents = (work / "bpe/train.bpe").read_text().split("\n\n")
    assert len(documents) == 16 and min(len(d.split()) for d in documents) > 4096


def test_pretraining_trains_on_4096_token_blocks_and_the_table_reports_both_models(recipe):
    work, out = recipe
    for arch in ARCHS:
        log = (work / f"train_{arch}.log").read_text()
        assert "num_updates 30" in log and re.search(r"loaded \d+ blocks from: \S+/train", log)
        assert (work / f"checkpoints/{arch}/checkpoint_best.pt").exists()
        row = re.search(rf"^\| {arch} \| ([0-9,]+) \| ([0-9.]+) \| ([0-9.]+) \|$", out, flags=re.M)
        assert row, out[-3000:]
        # 256 pieces: uniform guessing scores 256; after 4 updates both models scored 248-250 (measured), after 30
        # 164-171: the models learned
        assert all(1 < float(ppl) < 200 for ppl in row.groups()[1:]), row.group(0)
        validated = (work / f"validate_{arch}.log").read_text()  # both splits, masked as they would be alone
        assert re.search(rf"valid on 'test' subset .*\| ppl {re.escape(row.group(3))} \|", validated), validated


def test_the_evidence_table_scores_what_fairseq_validate_scored_and_ablates_only_the_ssm_model(recipe):
    work, out = recipe
    for split in ("valid", "test"):
        table = (work / f"evidence_{split}.md").read_text()
        assert table in out
        header = re.search(r"visible <= (\d+) tokens away", table)
        assert header and header.group(1) == "256", table  # local_roberta_base's reach: 2 layers x 128 keys
        for arch in ARCHS:
            validated = re.search(rf"valid on '{split}' subset .*\| ppl ([0-9.]+) \|",
                                  (work / f"validate_{arch}.log").read_text())
            row = re.search(rf"^\| {arch} \| [0-9,]+ \| ([0-9.]+) \|", table, flags=re.M)
            assert validated and row, table
            # the same masked tokens as fairseq-validate (seed 1, not the training seed): the same perplexity, to its
            # rounding
            assert abs(float(row.group(1)) - float(validated.group(1))) <= 0.01 + 1e-3 * float(validated.group(1))
        assert "| mssm_roberta_base, SSM output zeroed |" in table
        assert "local_roberta_base, SSM output zeroed" not in table
        assert re.search(r"^\| unigram \(training frequencies\) \| - \| [0-9.]+ \|", table, flags=re.M)


def test_finetuning_starts_from_the_pretrained_checkpoint_and_beats_the_majority_label(recipe):
    work, out = recipe
    labels = Counter(line.split("\t")[0] for line in (work / "raw/labelled/valid.tsv").read_text().splitlines())
    majority = 100 * max(labels.values()) / sum(labels.values())
    for arch in ARCHS:
        log = (work / f"finetune_{arch}.log").read_text()
        assert f"Loaded checkpoint {work}/checkpoints/{arch}/checkpoint_best.pt" in log
        accuracy = re.search(rf"^\| {arch} \| ([0-9.]+) \|$", out, flags=re.M)
        # always answering the most frequent label scores 27.5% on the 80 valid passages; measured: 17.5 (mssm)
        # and 27.5 (local) after 1 epoch, 98.8 and 98.8 after 5; measured again (November 27, SEED=2): mssm 27.5,
        # 60, 81.2, 81.2, 97.5 and local 27.5, 52.5, 45, 55, 81.2 by epoch, so local needs all 5 epochs
        assert accuracy and float(accuracy.group(1)) > majority + 30, (accuracy and accuracy.group(0), majority)


def test_the_recipe_restarts_at_the_table(recipe):
    work, _ = recipe
    out = run_ok(["bash", "recipes/mlm/run.sh", "--conf", "recipes/mlm/conf/sample.sh", "--stage", "5",
                  "--stop-stage", "5"], env=recipe_env(work))
    assert all(f"| {arch} |" in out for arch in ARCHS)


def test_preprocessing_reruns_on_the_same_dictionary_and_refuses_a_changed_one(recipe, tmp_path):
    """Stage 2 again keeps the dictionary the checkpoints were trained with; a changed corpus is refused, the data
    and dictionary in place left as they were."""
    work = tmp_path / "work"
    for part in ("bpe", "data-bin"):
        shutil.copytree(recipe[0] / part, work / part)
    dictionary = (work / "data-bin/dict.txt").read_bytes()
    stage_2 = ["bash", "recipes/mlm/run.sh", "--conf", "recipes/mlm/conf/sample.sh", "--stage", "2", "--stop-stage", "2"]
    run_ok(stage_2, env=recipe_env(work))
    assert (work / "data-bin/dict.txt").read_bytes() == dictionary
    assert (work / "data-bin/labelled/label/train.bin").exists() and not (work / "data-bin.new").exists()
    with open(work / "bpe/train.bpe", "a", encoding="utf-8") as corpus:
        corpus.write("\n▁a ▁paragraph ▁of ▁pieces ▁never ▁seen\n")
    result = subprocess.run(stage_2, capture_output=True, text=True, cwd=REPO, env=recipe_env(work))
    assert result.returncode != 0, result.stdout[-2000:]
    assert f"{work}/data-bin.new/dict.txt differs from {work}/data-bin/dict.txt" in result.stderr, result.stderr
    assert (work / "data-bin/dict.txt").read_bytes() == dictionary


def test_the_recipe_fails_when_nothing_was_scored(recipe, tmp_path):
    work, _ = recipe
    (tmp_path / "validate_mssm_roberta_base.log").write_text("no scores here\n")
    result = subprocess.run(["bash", "recipes/mlm/run.sh", "--conf", "recipes/mlm/conf/sample.sh", "--stage", "5",
                             "--stop-stage", "5"], capture_output=True, text=True, cwd=REPO,
                            env=recipe_env(tmp_path, ARCHS="mssm_roberta_base"))
    assert result.returncode != 0 and "no perplexity" in result.stderr


def test_a_malformed_labelled_row_is_named(tmp_path):
    raw = tmp_path / "raw"
    run_ok([str(BIN / "python"), "scripts/make_long_documents.py", str(raw), "--train", "1", "--valid", "1",
            "--test", "1", "--words", "50", "--labelled", "10"])
    with open(raw / "labelled/valid.tsv", "a") as f:
        f.write("no tab in this row\n")
    result = subprocess.run([str(BIN / "python"), "scripts/prepare_mlm.py", "--raw", str(raw), "--out",
                             str(tmp_path / "bpe"), "--labelled", str(raw / "labelled")],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode != 0 and f"{raw}/labelled/valid.tsv:3" in result.stderr


def evidence_places(tsv: Path) -> list[tuple[str, str, float]]:
    """``(label, passage, place of its one sentence of a setting)`` per row; the place as a fraction of the passage's
    sentences (0: first). Fails unless the passage has exactly one such sentence, of its label's setting."""
    sys.path.insert(0, str(REPO / "scripts"))
    from make_long_documents import SETTINGS

    rows = []
    for row in tsv.read_text().splitlines():
        label, text = row.split("\t")
        sentences = re.split(r"(?<=\.) ", text)
        evidence = [(i, setting) for i, s in enumerate(sentences) for setting, (nouns, verbs) in SETTINGS.items()
                    if set(re.findall(r"[a-z]+", s)) & set(nouns)]
        assert len(evidence) == 1 and evidence[0][1] == label, (label, evidence)
        rows.append((label, text, evidence[0][0] / len(sentences)))
    return rows


def test_long_labelled_passages_hold_their_only_evidence_anywhere_or_first(tmp_path):
    """--labelled-words: every passage is neutral but for one sentence of its label's setting, at any place; with
    --labelled-evidence first, the same passages with that sentence first."""
    generate = [str(BIN / "python"), "scripts/make_long_documents.py", "--train", "1", "--valid", "1", "--test", "1",
                "--words", "50", "--labelled", "60", "--labelled-words", "300"]
    run_ok([*generate, str(tmp_path / "anywhere")])
    run_ok([*generate, str(tmp_path / "first"), "--labelled-evidence", "first"])
    anywhere = evidence_places(tmp_path / "anywhere/labelled/train.tsv")
    first = evidence_places(tmp_path / "first/labelled/train.tsv")
    assert all(len(text.split()) >= 300 for _, text, _ in anywhere)
    places = [place for *_, place in anywhere]
    # drawn uniformly: some in each third of their passage
    assert min(places) < 1 / 3 and max(places) > 2 / 3 and any(1 / 3 <= p <= 2 / 3 for p in places), places
    assert all(place == 0 for *_, place in first)
    assert [(label, sorted(text.split())) for label, text, _ in first] == \
        [(label, sorted(text.split())) for label, text, _ in anywhere]  # the same words, only the order differs


def test_kernel_plots_of_a_trained_checkpoint(recipe, tmp_path):
    work, _ = recipe
    png = tmp_path / "kernels.png"
    run_ok([str(BIN / "python"), "scripts/plot_kernels.py", str(work / "checkpoints/mssm_roberta_base/checkpoint_best.pt"),
            "--layer", "1", "--heads", "0", "1", "2", "-o", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    result = subprocess.run([str(BIN / "python"), "scripts/plot_kernels.py",
                             str(work / "checkpoints/local_roberta_base/checkpoint_best.pt"), "--layer", "0", "-o",
                             str(tmp_path / "none.png")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode != 0 and "no stage-0 MSSM kernels in layer 0" in result.stderr
