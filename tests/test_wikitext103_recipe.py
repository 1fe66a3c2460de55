"""The WikiText-103 recipe and fairseq's CLIs on the shipped WikiText-format sample, with a tiny SPADE LM."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cli import BIN, REPO, run_ok

pytestmark = pytest.mark.slow

TINY = ("--decoder-layers 2 --decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 4 "
        "--attention-window 8 --adaptive-input-cutoff 20,60 --adaptive-softmax-cutoff 20,60 --ssm-state-size 8")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Stages 1-5 of the recipe: preprocess, train 40 updates, eval-lm on valid and test, the tables."""
    work = tmp_path_factory.mktemp("wikitext103")
    env = dict(os.environ, DATA_DIR=str(REPO / "recipes/wikitext103/sample"), WORK_DIR=str(work), PYTHON_BIN=str(BIN),
               TOKENS_PER_SAMPLE="64", CONTEXT_WINDOW="16", EVAL_ARGS="--cpu",
               TRAIN_ARGS=f"{TINY} --max-update 40 --warmup-updates 1 --max-tokens 256 --update-freq 1 --cpu "
                          "--num-workers 0 --no-epoch-checkpoints")
    out = run_ok(["bash", "recipes/wikitext103/run.sh", "--stage", "1", "--stop-stage", "5"], env=env)
    table = re.search(r"\| spade_lm_wiki103 \| [0-9,]+ \| ([0-9.]+) \| ([0-9.]+) \|", out)
    assert table, out[-2000:]
    # The sample has 132 word types (uniform guessing: ppl ~140) and a unigram model of its training split scores
    # ppl ~72 on valid and test. 40 updates reach ~18 (measured); after 1 update it is ~340: the model learned.
    assert all(1 < float(ppl) < 40 for ppl in table.groups()), table.group(0)
    assert "Perplexity" in (work / "eval_spade_lm_wiki103_seed1_test.log").read_text()
    return work


CHECKPOINT = "checkpoints/spade_lm_wiki103_seed1/checkpoint_best.pt"


def test_recipe_stages_train_and_score(trained):
    assert (trained / CHECKPOINT).exists()


def test_distance_table_scores_every_test_token_as_eval_lm_does(trained):
    table = (trained / "distance_table.md").read_text()
    rows = {row.split(" | ")[0].lstrip("| "): row for row in table.splitlines()[2:]}
    assert sorted(rows) == ["spade_lm_wiki103", "spade_lm_wiki103, SSM output zeroed"], table
    # 2 layers x window 8 = 16 tokens of reach; the sample's test split has 533 tokens (its words and line ends)
    assert "last seen <= 16 tokens back" in table and "all (533 tokens)" in table, table
    counts = [int(n) for n in re.findall(r"\((\d+)\) \|", table.splitlines()[0])]
    assert sum(counts) == 533, table
    everything = float(rows["spade_lm_wiki103"].split(" | ")[2])
    # the same checkpoint twice under one name: one row, mean (min-max) of equal values
    twice = run_ok([str(BIN / "python"), "scripts/lm_distance_perplexity.py", str(trained / "data-bin"), "--checkpoint",
                    f"m={trained / CHECKPOINT}", "--checkpoint", f"m={trained / CHECKPOINT}", "--tokens-per-sample",
                    "64", "--device", "cpu"])
    assert f"| m (2 runs) | {rows['spade_lm_wiki103'].split(' | ')[1]} | {everything:.2f} ({everything:.2f}-" \
           f"{everything:.2f}) |" in twice, twice
    # --only: the capitalised words the model knows, counted in the raw test split
    known = {line.split()[0] for line in (trained / "data-bin/dict.txt").read_text().splitlines()}
    words = (REPO / "recipes/wikitext103/sample/wiki.test.tokens").read_text().split()
    capitalised = sum(1 for w in words if re.fullmatch("[A-Z].*", w) and w in known)
    only = run_ok([str(BIN / "python"), "scripts/lm_distance_perplexity.py", str(trained / "data-bin"), "--checkpoint",
                   f"m={trained / CHECKPOINT}", "--tokens-per-sample", "64", "--device", "cpu", "--only", "[A-Z].*"])
    assert f"all ({capitalised} tokens matching [A-Z].*)" in only and capitalised > 20, only
    result = subprocess.run([str(BIN / "python"), "scripts/lm_distance_perplexity.py", str(trained / "data-bin"),
                             "--checkpoint", f"m={trained / CHECKPOINT}", "--tokens-per-sample", "64", "--only", "Zz+"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and "--only 'Zz+': no token of" in result.stderr, result.stderr[-1000:]
    out = run_ok([str(BIN / "fairseq-eval-lm"), str(trained / "data-bin"), "--user-dir", "ssm_fairseq",
                  "--path", str(trained / CHECKPOINT), "--gen-subset", "test", "--tokens-per-sample", "64",
                  "--context-window", "0", "--max-tokens", "64", "--required-batch-size-multiple", "1", "--cpu"])
    assert everything == pytest.approx(float(re.search(r"Perplexity: ([0-9.]+)", out).group(1)), abs=0.011)


def test_recipe_restarts_at_a_stage(trained):
    env = dict(os.environ, WORK_DIR=str(trained), TOKENS_PER_SAMPLE="64")
    dictionary = (trained / "data-bin/dict.txt").read_bytes()
    run_ok(["bash", "recipes/wikitext103/run.sh", "--stage", "1", "--stop-stage", "1"],
           env=dict(env, DATA_DIR=str(REPO / "recipes/wikitext103/sample")))
    assert (trained / "data-bin/dict.txt").read_bytes() == dictionary  # the same corpus: preprocessed again
    out = run_ok(["bash", "recipes/wikitext103/run.sh", "--stage", "4"], env=env)
    assert "| spade_lm_wiki103 |" in out and "| spade_lm_wiki103, SSM output zeroed |" in out
    # scoring longer blocks than the model was trained on is refused, naming the checkpoint
    env["TOKENS_PER_SAMPLE"] = "128"
    result = subprocess.run(["bash", "recipes/wikitext103/run.sh", "--stage", "5"], capture_output=True, text=True,
                            cwd=REPO, env=env)
    assert result.returncode != 0 and f"--tokens-per-sample 128 is longer than {trained / CHECKPOINT} takes (64 " \
        "tokens" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("search", [["--beam", "2"], ["--sampling", "--sampling-topk", "5", "--beam", "1"]])
def test_fairseq_interactive_continues_prompts(trained, search):
    out = run_ok([str(BIN / "fairseq-interactive"), str(trained / "data-bin"), "--user-dir", "ssm_fairseq", "--task",
                "language_modeling", "--path", str(trained / CHECKPOINT), *search, "--max-len-b", "12", "--cpu"],
               input="The old bridge was\nIt is now\n")
    hypotheses = re.findall(r"^H-(\d+)\t\S+\t(.+)$", out, flags=re.M)
    assert [i for i, _ in hypotheses] == ["0", "1"]
    assert hypotheses[0][1].startswith("The old bridge was") and len(hypotheses[0][1].split()) > 4


def test_fairseq_generate_continues_prompts(trained, tmp_path):
    # one prompt per line, binarised with the training dictionary; each line is a prefix to continue.
    # fairseq's default --required-batch-size-multiple 8 silently drops batches smaller than 8: use 1.
    (tmp_path / "prompts.txt").write_text("The old bridge was\nIt is now a\nThe castle was opened in\n")
    run_ok([str(BIN / "fairseq-preprocess"), "--only-source", "--testpref", str(tmp_path / "prompts.txt"),
          "--srcdict", str(trained / "data-bin/dict.txt"), "--destdir", str(tmp_path / "prompts-bin")])
    out = run_ok([str(BIN / "fairseq-generate"), str(tmp_path / "prompts-bin"), "--user-dir", "ssm_fairseq", "--task",
                "language_modeling", "--path", str(trained / CHECKPOINT), "--gen-subset", "test", "--beam", "2",
                "--max-len-b", "20", "--batch-size", "2", "--cpu",
                "--tokens-per-sample", "64", "--sample-break-mode", "eos", "--required-batch-size-multiple", "1"])
    hypotheses = dict(re.findall(r"^H-(\d+)\t\S+\t(.+)$", out, flags=re.M))
    assert sorted(hypotheses) == ["0", "1", "2"]
    assert hypotheses["2"].startswith("The castle was opened in") and len(hypotheses["2"].split()) > 5


def test_recipe_reports_missing_data(tmp_path):
    env = dict(os.environ, DATA_DIR=str(tmp_path), WORK_DIR=str(tmp_path / "work"), PYTHON_BIN=str(BIN))
    result = subprocess.run(["bash", "recipes/wikitext103/run.sh", "--stage", "1", "--stop-stage", "1"],
                            capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode != 0 and "wiki.train.tokens" in result.stderr


def test_scoring_fails_where_no_token_was_scored(trained, tmp_path):
    # sequences longer than the model allows are all skipped: eval-lm scores nothing (and prints perplexity 1.00)
    work = tmp_path / "work"
    shutil.copytree(trained, work)
    env = dict(os.environ, WORK_DIR=str(work), PYTHON_BIN=str(BIN), TOKENS_PER_SAMPLE="100000", EVAL_ARGS="--cpu")
    result = subprocess.run(["bash", "recipes/wikitext103/run.sh", "--stage", "3", "--stop-stage", "3"],
                            capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode != 0 and "no token was scored in" in result.stderr, result.stderr[-2000:]
    assert "Perplexity" not in result.stdout
    # the table, run on its own over those logs, refuses them too
    result = subprocess.run(["bash", "recipes/wikitext103/run.sh", "--stage", "4"],
                            capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode != 0 and "no token was scored in" in result.stderr
    assert "| spade_lm_wiki103 |" not in result.stdout


@pytest.mark.parametrize("window, tokens, message", [
    ("64", "64", "CONTEXT_WINDOW (64) must be smaller than TOKENS_PER_SAMPLE (64)"),
    ("16", "0", "TOKENS_PER_SAMPLE must be a positive integer, got '0'"),
    ("-1", "64", "CONTEXT_WINDOW must be a non-negative integer, got '-1'"),
])
def test_scoring_refuses_a_context_window_that_leaves_nothing_to_score(tmp_path, window, tokens, message):
    env = dict(os.environ, WORK_DIR=str(tmp_path), PYTHON_BIN=str(BIN), TOKENS_PER_SAMPLE=tokens,
               CONTEXT_WINDOW=window)
    result = subprocess.run(["bash", "recipes/wikitext103/run.sh", "--stage", "3", "--stop-stage", "3"],
                            capture_output=True, text=True, cwd=REPO, env=env)
    assert result.returncode == 2 and result.stderr.strip() == message, result.stderr[-2000:]


def test_the_recipe_trains_the_arch_its_usage_offers_without_adaptive_softmax(trained, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(trained / "data-bin", work / "data-bin")
    env = dict(os.environ, WORK_DIR=str(work), PYTHON_BIN=str(BIN),
               TRAIN_ARGS="--decoder-layers 1 --decoder-embed-dim 16 --decoder-ffn-embed-dim 32 --attention-window 8 "
                          "--ssm-state-size 8 --max-update 2 --max-tokens 128 --update-freq 1 --cpu --num-workers 0 "
                          "--warmup-updates 1 --tokens-per-sample 64 --no-epoch-checkpoints")
    out = run_ok(["bash", "recipes/wikitext103/run.sh", "--stage", "2", "--stop-stage", "2", "--arch", "spade_lm"],
                 env=env)
    assert "num_updates 2" in out and (work / "checkpoints/spade_lm_seed1/checkpoint_last.pt").exists()


LONG_DOCUMENTS = "recipes/wikitext103/conf/long_documents.sh"
ARCHS = ("spade_lm", "local_lm", "transformer_lm")
OPENINGS = {"This", "The", "Everyone", "At", "After", "In", "Before", "That"}  # capitalised words that are not names


def test_long_documents_sample_compares_equal_sized_models(tmp_path):
    """conf/long_documents.sh end to end at a tiny scale: the generated corpus, the three models, both tables. The
    models are equal in size and each learned; which one wins is the docs' business."""
    env = dict(os.environ, WORK_DIR=str(tmp_path), PYTHON_BIN=str(BIN), SEEDS="1", TOKENS_PER_SAMPLE="128",
               SAMPLE_ARGS="--train 12 --valid 1 --test 1 --words 800 --name-pool 32 --split-punctuation",
               OPTIM_ARGS="--max-tokens 1024 --optimizer adam --lr 3e-3 --lr-scheduler inverse_sqrt "
                          "--warmup-updates 5 --max-update 30",
               TRAIN_ARGS="--cpu --num-workers 0 --no-epoch-checkpoints", EVAL_ARGS="--cpu")
    out = run_ok(["bash", "recipes/wikitext103/run.sh", "--conf", LONG_DOCUMENTS, "--stage", "0"], env=env)
    table = {m.group(1): (int(m.group(2).replace(",", "")), float(m.group(3))) for m in re.finditer(
        r"^\| (\w+) \| ([0-9,]+) \| [0-9.]+ \| ([0-9.]+) \|$", out, flags=re.M)}
    assert sorted(table) == sorted(ARCHS), out[-3000:]
    sizes = [size for size, _ in table.values()]
    assert max(sizes) <= 1.05 * min(sizes), table  # equal size, within 5%
    # uniform guessing scores ~150 (the vocabulary), a unigram model of the training split ~87; 30 updates reach
    # 31-38 (measured), so each model uses its context
    assert all(ppl < 50 for _, ppl in table.values()), table
    distance = (tmp_path / "distance_table.md").read_text()
    names = [row.split(" | ")[0].lstrip("| ") for row in distance.splitlines()[2:]]
    assert names == ["spade_lm", "spade_lm, SSM output zeroed", "local_lm", "transformer_lm"], distance
    assert "last seen <= 32 tokens back" in distance  # spade_lm's reach: 2 layers x window 16
    names = (tmp_path / "distance_table_words.md").read_text()  # the conf's WORD_PATTERN: the invented names
    count = int(re.search(r"all \((\d+) tokens matching ", names).group(1))
    test_words = (tmp_path / "raw/wiki.test.tokens").read_text().split()
    assert count == sum(1 for w in test_words if w[0].isupper() and w not in OPENINGS) > 50, names


def test_tables_summarise_seeds_as_mean_and_range(tmp_path):
    """Stage 4 over logs of two seeds (written here): each cell is the mean (min-max)."""
    for seed, ppl in ((1, "10.00"), (2, "20.00")):
        (tmp_path / f"train_toy_seed{seed}.log").write_text("num. shared model params: 1,234 (num. trained: 1,234)\n")
        for split in ("valid", "test"):
            (tmp_path / f"eval_toy_seed{seed}_{split}.log").write_text(
                f"Evaluated 100 tokens in 1.0s\nLoss (base 2): 3.3, Perplexity: {ppl}\n")
    env = dict(os.environ, WORK_DIR=str(tmp_path), PYTHON_BIN=str(BIN), ARCHS="toy", SEEDS="1 2")
    out = run_ok(["bash", "recipes/wikitext103/run.sh", "--stage", "4", "--stop-stage", "4"], env=env)
    assert "| toy (2 seeds) | 1,234 | 15.00 (10.00-20.00) | 15.00 (10.00-20.00) |" in out, out


def test_name_pool_and_split_punctuation(tmp_path):
    run_ok([str(BIN / "python"), "scripts/make_long_documents.py", str(tmp_path), "--train", "4", "--valid", "1",
            "--test", "1", "--words", "300", "--name-pool", "14", "--split-punctuation"])
    words = [w for split in ("train", "valid", "test") for w in (tmp_path / f"{split}.txt").read_text().split()]
    assert len({w for w in words if w[0].isupper() and w not in OPENINGS}) <= 14  # every name from the pool
    assert {".", ","} <= set(words) and not any(len(w) > 1 and w[-1] in ".," for w in words)
    result = subprocess.run([str(BIN / "python"), "scripts/make_long_documents.py", str(tmp_path), "--name-pool", "5"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and "--name-pool must hold at least 14 names" in result.stderr


@pytest.mark.parametrize("variable, value, message", [
    ("SEEDS", "1 x", "SEEDS: 'x' is not a non-negative integer"),
    ("SEEDS", " ", "SEEDS: no seed given"),
    ("ARCHS", " ", "ARCHS: no architecture given"),
])
def test_the_recipe_refuses_bad_seeds_and_architectures(tmp_path, variable, value, message):
    env = dict(os.environ, WORK_DIR=str(tmp_path), PYTHON_BIN=str(BIN), **{variable: value})
    result = subprocess.run(["bash", "recipes/wikitext103/run.sh", "--stage", "4"], capture_output=True, text=True,
                            cwd=REPO, env=env)
    assert result.returncode == 2 and result.stderr.strip() == message, result.stderr[-2000:]
