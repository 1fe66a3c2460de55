"""The mini LibriSpeech generator's sentence splits, and the committed corpus it made (no espeak-ng needed)."""
from __future__ import annotations

import importlib.util
import random
import re
import sys
from pathlib import Path

import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "recipes/librispeech/mini"
_spec = importlib.util.spec_from_file_location("make_mini_librispeech", REPO / "scripts/make_mini_librispeech.py")
mini = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up
_spec.loader.exec_module(mini)


@pytest.fixture(scope="module")
def splits() -> dict[str, list[str]]:
    return mini.make_splits(600, 60, 60, seed=1, n_test_large=600)


def _words(sentences: list[str]) -> set[str]:
    return {word for text in sentences for word in text.split()}


def test_sentences_have_4_to_12_upper_case_words():
    rng = random.Random(0)
    lengths = set()
    for _ in range(2000):
        text = mini.sentence(rng)
        assert re.fullmatch(r"[A-Z]+( [A-Z]+)*", text), text
        lengths.add(len(text.split()))
    assert lengths == set(range(4, 13))


def test_split_sizes_and_distinct_sentences(splits):
    assert [len(splits[subset]) for subset in mini.SUBSETS] == [600, 60, 60, 600]
    everything = [text for sentences in splits.values() for text in sentences]
    assert len(set(everything)) == len(everything)


def test_dev_and_test_are_new_sentences_of_train_words(splits):
    train = splits["train-mini"]
    for subset in ("dev-mini", "test-mini", "test-large"):
        assert not set(splits[subset]) & set(train)
        assert _words(splits[subset]) <= _words(train)


def test_vocabulary_is_a_few_hundred_words(splits):
    assert 190 <= len(mini.vocabulary()) <= 260
    assert _words(splits["train-mini"]) <= mini.vocabulary()
    assert len(_words(splits["train-mini"])) >= 0.95 * len(mini.vocabulary())


def test_splits_are_deterministic_per_seed(splits):
    assert mini.make_splits(600, 60, 60, seed=1, n_test_large=600) == splits
    assert mini.make_splits(600, 60, 60, seed=2, n_test_large=600) != splits


def test_test_large_is_drawn_last_so_the_other_subsets_do_not_depend_on_it(splits):
    without = mini.make_splits(600, 60, 60, seed=1)
    assert without["test-large"] == [] and all(without[s] == splits[s] for s in mini.SUBSETS[:3])
    assert mini.make_splits(600, 60, 60, seed=1, n_test_large=600 + 60)["test-large"][:600] == splits["test-large"]


def test_running_out_of_sentences_is_a_clear_error():
    with pytest.raises(ValueError, match="could not draw 5 new dev-mini sentences"):
        mini.make_splits(1, 5, 0, seed=0)  # dev may only use the few words of one train sentence


def test_speakers_are_dealt_to_every_subset(splits):
    speakers = mini.make_speakers(seed=1)
    utterances = mini.assign(splits, speakers, seed=1)
    for subset in mini.SUBSETS:
        assert {u.speaker for u in utterances if u.subset == subset} == set(speakers)
    assert len({u.id for u in utterances}) == len(utterances)


def _transcripts(subset: Path) -> dict[str, str]:
    """Utterance id -> transcript of one committed subset, checking the LibriSpeech layout on the way."""
    lines = {}
    for trans in sorted(subset.glob("*/*/*.trans.txt")):
        speaker, chapter = trans.parent.parent.name, trans.parent.name
        assert trans.name == f"{speaker}-{chapter}.trans.txt"
        rows = trans.read_text().splitlines()
        assert rows == sorted(rows), trans
        for row in rows:
            utterance, text = row.split(" ", 1)
            assert re.fullmatch(rf"{speaker}-{chapter}-\d{{4}}", utterance), row
            assert text and text == text.upper(), row
            lines[utterance] = text
    return lines


def test_committed_corpus_has_librispeech_layout():
    root = CORPUS / "LibriSpeech"
    texts = {subset: _transcripts(root / subset) for subset in mini.SUBSETS}
    assert [len(texts[subset]) for subset in mini.SUBSETS] == [600, 60, 60, 600]
    for subset, lines in texts.items():
        flacs = {path.stem: path for path in (root / subset).glob("*/*/*.flac")}
        assert set(flacs) == set(lines), subset
        for path in flacs.values():
            info = sf.info(path)
            assert (info.samplerate, info.channels) == (16000, 1) and info.frames > 0, path
    held_out = [text for subset in mini.SUBSETS[1:] for text in texts[subset].values()]
    assert len(set(held_out)) == len(held_out) and not set(texts["train-mini"].values()) & set(held_out)
    assert texts == _made_by_the_generator()  # the committed transcripts are the generator's (seed 1)
    size = sum(path.stat().st_size for path in CORPUS.rglob("*") if path.is_file())
    assert size <= 18_500_000


def _made_by_the_generator() -> dict[str, dict[str, str]]:
    utterances = mini.assign(mini.make_splits(600, 60, 60, seed=1, n_test_large=600), mini.make_speakers(1), seed=1)
    texts: dict[str, dict[str, str]] = {subset: {} for subset in mini.SUBSETS}
    for utterance in utterances:
        texts[utterance.subset][utterance.id] = utterance.text
    return texts


def test_lm_text_holds_no_dev_or_test_sentence_of_the_committed_corpus(tmp_path):
    """--lm-text: grammar sentences for a language model, none of them an evaluation sentence (no audio made)."""
    out = tmp_path / "lm.txt"
    mini.main(["--lm-text", str(out), "--lm-sentences", "3000"])
    sentences = out.read_text().splitlines()
    assert len(sentences) == 3000 and len(set(sentences)) > 2000
    root = REPO / "recipes/librispeech/mini/LibriSpeech"
    held_out = {text for subset in mini.SUBSETS[1:] for text in _transcripts(root / subset).values()}
    assert len(held_out) == 720 and not held_out & set(sentences)
    assert set(" ".join(sentences).split()) <= mini.vocabulary()


def test_lm_sentences_leave_out_the_held_out_ones():
    drawn = mini.lm_sentences(500, set(), seed=1)
    held_out = set(drawn[:50])
    kept = mini.lm_sentences(500, held_out, seed=1)
    assert len(kept) == 500 and not held_out & set(kept)
    assert kept[0] == drawn[next(i for i, s in enumerate(drawn) if s not in held_out)]  # the same stream, filtered
