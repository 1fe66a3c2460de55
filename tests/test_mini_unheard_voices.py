"""The mini corpus's test-unheard subset: held-out sentences read by voices no other subset has, drawn and numbered
after everything else, so that adding it changed no other subset (no espeak-ng needed)."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import soundfile as sf

from cli import REPO

CORPUS = REPO / "recipes/librispeech/mini"
_spec = importlib.util.spec_from_file_location("make_mini_librispeech", REPO / "scripts/make_mini_librispeech.py")
mini = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))  # dataclasses look their module up
if not hasattr(mini, "make_splits"):
    _spec.loader.exec_module(mini)

SIZES = dict(n_train=600, n_dev=60, n_test=60, seed=1, n_test_large=600)


@pytest.fixture(scope="module")
def splits() -> dict[str, list[str]]:
    return mini.make_splits(**SIZES, n_test_unheard=120)


def test_unheard_voices_are_not_training_voices():
    speakers, unheard = mini.make_speakers(1), mini.make_unheard_speakers(1)
    assert {s.voice for s in unheard} == set(mini.UNHEARD_VOICES) and not set(mini.UNHEARD_VOICES) & set(mini.VOICES)
    assert not {s.id for s in unheard} & {s.id for s in speakers}
    assert all(s.rate in mini.RATES and s.pitch in mini.PITCHES for s in unheard)  # only the voice is new


def test_unheard_sentences_are_new_sentences_of_train_words_drawn_last(splits):
    without = mini.make_splits(**SIZES)
    assert without[mini.UNHEARD_SUBSET] == [] and all(without[s] == splits[s] for s in mini.SUBSETS)
    unheard = splits[mini.UNHEARD_SUBSET]
    assert len(unheard) == len(set(unheard)) == 120
    assert not set(unheard) & {text for s in mini.SUBSETS for text in splits[s]}
    assert {w for text in unheard for w in text.split()} <= {w for text in splits["train-mini"] for w in text.split()}


def test_unheard_utterances_leave_the_other_subsets_ids_as_they_were(splits):
    speakers, unheard = mini.make_speakers(1), mini.make_unheard_speakers(1)
    before = mini.assign(mini.make_splits(**SIZES), speakers, seed=1)
    after = mini.assign(splits, speakers, seed=1, unheard_speakers=unheard)
    assert [u for u in after if u.subset != mini.UNHEARD_SUBSET] == before
    read = [u for u in after if u.subset == mini.UNHEARD_SUBSET]
    assert {u.speaker for u in read} == set(unheard) and len(read) == 120
    assert min(u.chapter for u in read) > max(u.chapter for u in before)
    with pytest.raises(ValueError, match="120 test-unheard sentences and no unheard_speakers"):
        mini.assign(splits, speakers, seed=1)


def test_committed_test_unheard_is_the_generators():
    root = CORPUS / "LibriSpeech" / mini.UNHEARD_SUBSET
    committed = {}
    for trans in sorted(root.glob("*/*/*.trans.txt")):
        for line in trans.read_text().splitlines():
            utterance, text = line.split(" ", 1)
            committed[utterance] = text
            info = sf.info(trans.parent / f"{utterance}.flac")
            assert (info.samplerate, info.channels) == (16000, 1) and info.frames > 0
    made = mini.assign(mini.make_splits(**SIZES, n_test_unheard=120), mini.make_speakers(1), seed=1,
                       unheard_speakers=mini.make_unheard_speakers(1))
    assert committed == {u.id: u.text for u in made if u.subset == mini.UNHEARD_SUBSET}
    assert "| test-unheard | 120 |" in (CORPUS / "README.md").read_text()


def test_subsets_option_refuses_unknown_subsets(tmp_path, capsys):
    with pytest.raises(SystemExit):
        mini.main(["--out", str(tmp_path), "--subsets", "test-nothing"])
    assert "--subsets: test-nothing is not a subset of this corpus" in capsys.readouterr().err
