"""The mini corpus's reference word boundaries (``scripts/mini_word_boundaries.py``) and the word-timestamp
benchmark's pairing of hypothesis words with them (``scripts/benchmarks/word_timestamps.py``)."""
from __future__ import annotations

import ctypes.util
import sys

import pytest

from cli import REPO

sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "scripts" / "benchmarks"))

import make_mini_librispeech as corpus  # noqa: E402
from mini_word_boundaries import (EVENT_END, EVENT_PHONEME, EVENT_WORD, Event, WordBoundary,  # noqa: E402
                                  read_boundaries, utterance_boundaries, word_sample_spans)
from word_timestamps import paired_errors  # noqa: E402

from ssm_fairseq.asr.search.word_timestamps import TimedWord  # noqa: E402

BOUNDARIES = REPO / "recipes" / "librispeech" / "mini" / "word_boundaries"


def _events(*items) -> list[Event]:
    """``("word", sample, position)`` word events, ``(name, sample)`` phonemes, ``("end", sample)``."""
    events = []
    for item in items:
        if item[0] == "word":
            events.append(Event(EVENT_WORD, item[1], "", item[2]))
        elif item[0] == "end":
            events.append(Event(EVENT_END, item[1], "", 0))
        else:
            events.append(Event(EVENT_PHONEME, item[1], item[0], 0))
    return events


def test_a_word_spans_its_phonemes_up_to_what_follows_them():
    # "ab cd": a word event per word (1-based character positions 1 and 4), a final pause, the end
    events = _events(("word", 0, 1), ("a", 10), ("b", 30), ("word", 45, 4), ("c", 50), ("d", 70), ("_:", 90),
                     ("_", 120), ("end", 120))
    assert word_sample_spans(["ab", "cd"], events, 120) == [(10, 50), (50, 90)]
    # nothing after the last phoneme: the end of the audio
    assert word_sample_spans(["ab"], _events(("word", 0, 1), ("a", 5), ("b", 9)), 40) == [(5, 40)]


def test_words_read_as_one_keep_their_inner_boundary_unknown():
    # "there was the": espeak-ng reads "there was" as one entry (one word event, at "there")
    events = _events(("word", 0, 1), ("D", 5), ("e@", 20), ("w", 40), ("V", 55), ("z", 60), ("word", 70, 11),
                     ("D", 72), ("@", 80), ("end", 100))
    assert word_sample_spans(["there", "was", "the"], events, 100) == [(5, None), (None, 72), (72, 100)]


def test_word_events_that_do_not_start_a_word_are_refused():
    with pytest.raises(ValueError, match="a word event at character 2 starts no new word"):
        word_sample_spans(["ab"], _events(("word", 0, 2), ("a", 1)), 10)
    with pytest.raises(ValueError, match="1 without a phoneme"):
        word_sample_spans(["ab", "cd"], _events(("word", 0, 1), ("a", 1), ("word", 5, 4)), 10)


def test_the_boundary_files_read_back_and_bad_lines_are_named(tmp_path):
    path = tmp_path / "b.tsv"
    path.write_text("utterance\tindex\tword\tstart\tend\nu\t0\tTHERE\t0.010\t-\nu\t1\tWAS\t-\t0.300\n")
    assert read_boundaries(path) == {"u": [WordBoundary("u", 0, "THERE", 0.01, None),
                                           WordBoundary("u", 1, "WAS", None, 0.3)]}
    path.write_text("utterance\tindex\tword\tstart\tend\nu\t0\tA\t0.5\t0.4\n")
    with pytest.raises(ValueError, match=r"b.tsv:2: word 0 out of order or with start after end"):
        read_boundaries(path)
    path.write_text("utterance\tindex\tword\tstart\nu\t0\tA\t0.5\n")
    with pytest.raises(ValueError, match="b.tsv:1: header"):
        read_boundaries(path)


def test_only_correct_words_are_scored_where_the_reference_knows_the_time():
    reference = [WordBoundary("u", 0, "THE", 0.0, 0.2), WordBoundary("u", 1, "CAT", 0.2, None),
                 WordBoundary("u", 2, "SAT", None, 0.9)]
    hypothesis = [TimedWord("the", 0.04, 0.16), TimedWord("hat", 0.2, 0.5), TimedWord("sat", 0.6, 1.0)]
    starts, ends = paired_errors(hypothesis, reference)
    assert starts == pytest.approx([40.0]) and ends == pytest.approx([-40.0, 100.0])


def test_the_committed_boundaries_cover_the_test_sets():
    for subset, utterances in (("dev-mini", 60), ("test-mini", 60), ("test-large", 600)):
        boundaries = read_boundaries(BOUNDARIES / f"{subset}.tsv")
        assert len(boundaries) == utterances
        transcripts = {}
        for transcript in (REPO / "recipes" / "librispeech" / "mini" / "LibriSpeech" / subset).rglob("*.trans.txt"):
            for line in transcript.read_text().splitlines():
                utterance, text = line.split(" ", 1)
                transcripts[utterance] = text
        assert {u: " ".join(w.word for w in words) for u, words in boundaries.items()} == transcripts


@pytest.mark.skipif(ctypes.util.find_library("espeak-ng") is None, reason="libespeak-ng (espeak-ng 1.51) not installed")
def test_a_synthesised_utterance_is_its_stored_file_and_gives_the_committed_boundaries():
    splits = corpus.make_splits(600, 60, 60, 1, 600)
    utterance = next(u for u in corpus.assign(splits, corpus.make_speakers(1), 1) if u.id == "101-1016-0001")
    stored = REPO / "recipes" / "librispeech" / "mini" / "LibriSpeech" / utterance.folder / f"{utterance.id}.flac"
    boundaries = utterance_boundaries(utterance, stored)
    committed = read_boundaries(BOUNDARIES / "test-mini.tsv")[utterance.id]
    assert [b.word for b in boundaries] == [b.word for b in committed] == "EMMA LAUGHED ACROSS A BRIDGE".split()
    assert [t for b in boundaries for t in b[3:]] == pytest.approx([t for b in committed for t in b[3:]], abs=5e-4)
    other = next(u for u in corpus.assign(splits, corpus.make_speakers(1), 1) if u.id == "102-1017-0001")
    with pytest.raises(ValueError, match="is not this file's audio"):
        utterance_boundaries(other, stored)
