"""Text models keep their dictionaries' digests with the weights and refuse weights trained with other dictionaries
(``ssm_fairseq/integrity/dictionary_digest.py``), also through fairseq's commands."""
from __future__ import annotations

import logging
import shutil
import subprocess

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.tokenizer import tokenize_line

import spade_cases
import test_mssm_roberta
import test_spade_transformer
from cli import BIN, REPO, run_ok
from ssm_fairseq.integrity.checkpoint_checks import DictionaryMismatchError
from ssm_fairseq.integrity.dictionary_digest import dictionary_digest


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)


BUILDERS = {
    "spade_lm": lambda: spade_cases.build("spade_lm", *spade_cases.SMALL)[0],
    "spade_transformer": lambda: test_spade_transformer.build(),
    "mssm_roberta": lambda: test_mssm_roberta.build("mssm_roberta_base", **test_mssm_roberta.TINY),
}


def reordered(dictionary: Dictionary) -> Dictionary:
    """The same symbols with the last two swapped: as many entries, other meanings for two ids."""
    other = Dictionary()
    for symbol in dictionary.symbols[other.nspecial:-2] + dictionary.symbols[-2:][::-1]:
        other.add_symbol(symbol)
    assert len(other) == len(dictionary)
    return other


def source_dictionary(model) -> Dictionary:
    return (model.encoder if hasattr(model, "encoder") else model.decoder).dictionary


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_the_weights_carry_the_digest_of_each_dictionary_the_model_was_built_with(family):
    model = BUILDERS[family]()
    state = model.state_dict()
    assert torch.equal(state["source_dictionary_digest"], dictionary_digest(source_dictionary(model)))
    if family != "mssm_roberta":  # a masked LM predicts the tokens of its source dictionary
        assert torch.equal(state["target_dictionary_digest"], dictionary_digest(model.decoder.dictionary))
    assert not torch.equal(dictionary_digest(source_dictionary(model)),
                           dictionary_digest(reordered(source_dictionary(model))))


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_weights_of_another_dictionary_are_refused_and_earlier_weights_accepted_with_a_warning(family, caplog):
    torch.manual_seed(0)
    trained = BUILDERS[family]()
    state = trained.state_dict()
    same = BUILDERS[family]()
    same.load_state_dict(state)  # the same dictionary: loads
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), state.values()))

    other = BUILDERS[family]()
    other.remember_dictionaries(source=reordered(source_dictionary(other)))
    with pytest.raises(DictionaryMismatchError, match="another source dictionary .* token ids would mean other"):
        other.load_state_dict(state)

    earlier = {name: value for name, value in state.items() if not name.endswith("_dictionary_digest")}
    with caplog.at_level(logging.WARNING):
        BUILDERS[family]().load_state_dict(earlier)
    assert "record no source dictionary digest (saved by an earlier version)" in caplog.text


@pytest.mark.slow
def test_fairseq_commands_refuse_a_checkpoint_of_another_dictionary_naming_it(tmp_path):
    """A SPADE LM trained on one dict.txt; the same text with two entries of dict.txt swapped (a corpus prepared
    again): fairseq-eval-lm and resuming fairseq-train fail naming the checkpoint; the original directory works."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(REPO / "recipes/wikitext103/sample/wiki.valid.tokens", data / "train")
    shutil.copy(data / "train", data / "valid")
    dictionary = Dictionary()
    Dictionary.add_file_to_dictionary(str(data / "train"), dictionary, tokenize_line, num_workers=1)
    dictionary.save(str(data / "dict.txt"))
    swapped = tmp_path / "swapped"
    shutil.copytree(data, swapped)
    reordered(dictionary).save(str(swapped / "dict.txt"))

    train = [str(BIN / "fairseq-train"), "--user-dir", "ssm_fairseq", "--task", "language_modeling",
             "--dataset-impl", "raw", "--arch", "spade_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
             "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--attention-window", "8",
             "--ssm-state-size", "8", "--tokens-per-sample", "64", "--sample-break-mode", "none", "--max-tokens",
             "512", "--criterion", "cross_entropy", "--optimizer", "adam", "--lr", "1e-3", "--max-update", "1",
             "--no-epoch-checkpoints", "--cpu"]
    run_ok([*train[:1], str(data), *train[1:], "--save-dir", str(tmp_path / "ckpt")])
    checkpoint = tmp_path / "ckpt/checkpoint_last.pt"
    evaluate = [str(BIN / "fairseq-eval-lm"), "--user-dir", "ssm_fairseq", "--task", "language_modeling",
                "--dataset-impl", "raw", "--path", str(checkpoint), "--gen-subset", "valid", "--tokens-per-sample",
                "64", "--max-tokens", "512", "--cpu"]
    run_ok([*evaluate[:1], str(data), *evaluate[1:]])

    refused = run([*evaluate[:1], str(swapped), *evaluate[1:]])
    assert refused.returncode != 0
    assert f"checkpoint {checkpoint}: trained with another source dictionary" in refused.stderr

    resumed = run([*train[:1], str(swapped), *train[1:], "--max-update", "2", "--save-dir", str(tmp_path / "again"),
                   "--restore-file", str(checkpoint)])
    assert resumed.returncode != 0
    assert f"DictionaryMismatchError: checkpoint {checkpoint}: trained with another source dictionary" in \
        resumed.stderr
