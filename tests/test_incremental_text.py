"""Incremental detokenization (``asr.incremental_text``): the text of each hypothesis in a sequence equals fairseq's
``Dictionary.string(..., "sentencepiece")`` of it, detokenizing only the units after the prefix it shares with the
last one. No model: random SentencePiece-like units, hypotheses that grow, retract and switch as a beam's best does.
"""
from __future__ import annotations

import random

import pytest
from fairseq.data import Dictionary

from ssm_fairseq.asr.incremental_text import IncrementalText, common_prefix_length, unit_pieces

BOUNDARY = "\u2581"


def sentencepiece_dictionary(seed: int) -> Dictionary:
    """<s>, <pad>, </s>, <unk>, then word-initial units ("▁AB"), word-internal ones ("CD"), a lone "▁", and units
    that are only "▁"-runs or hold two "▁" (a word of one unit followed by a boundary)."""
    rng = random.Random(seed)
    dictionary = Dictionary()
    letters = "ABCDEFÉ'"
    for n in range(40):
        body = "".join(rng.choice(letters) for _ in range(rng.randint(1, 3)))
        dictionary.add_symbol((BOUNDARY + body) if n % 2 else body + ("" if n % 5 else str(n)))
    for symbol in (BOUNDARY, BOUNDARY * 2, f"{BOUNDARY}X{BOUNDARY}"):
        dictionary.add_symbol(symbol)
    return dictionary


def truth(dictionary: Dictionary, units: list[int], ignored: set[int]) -> str:
    import torch
    return dictionary.string(torch.tensor(units, dtype=torch.int), "sentencepiece", extra_symbols_to_ignore=ignored)


@pytest.mark.parametrize("seed", range(6))
def test_each_text_equals_full_detokenization_and_costs_only_the_changed_tail(seed):
    dictionary = sentencepiece_dictionary(seed)
    ignored = {dictionary.bos(), dictionary.eos()}
    rng = random.Random(seed)
    text = IncrementalText(unit_pieces(dictionary, ignored))
    emitted = list(range(len(dictionary)))  # every id, <unk>, </s>, <s> and <pad> too
    units: list[int] = []
    for step in range(400):
        move = rng.random()
        if move < 0.6:  # the best hypothesis grows by 0-3 units (a chunk's frames)
            units = units + [rng.choice(emitted) for _ in range(rng.randint(0, 3))]
        elif move < 0.85:  # another hypothesis takes over, differing in the last few units
            keep = max(0, len(units) - rng.randint(1, 4))
            units = units[:keep] + [rng.choice(emitted) for _ in range(rng.randint(0, 4))]
        elif move < 0.95:  # one differing early
            keep = rng.randint(0, len(units))
            units = units[:keep] + [rng.choice(emitted) for _ in range(rng.randint(0, 6))]
        else:  # a new segment's search: starts empty
            units = []
        before = text.units_detokenized
        shared = common_prefix_length(text.units, units)
        assert text.text(units) == truth(dictionary, units, ignored)
        assert text.units_detokenized - before == len(units) - shared  # only the units after the shared prefix


def test_a_growing_hypothesis_costs_its_new_units_whatever_its_length():
    dictionary = sentencepiece_dictionary(0)
    text = IncrementalText(unit_pieces(dictionary, set()))
    word_initial = [i for i in range(dictionary.nspecial, len(dictionary)) if dictionary[i].startswith(BOUNDARY)]
    units: list[int] = []
    for n in range(2000):
        before = text.units_detokenized
        units.append(word_initial[n % len(word_initial)])
        text.text(units)
        assert text.units_detokenized - before == 1
    assert text.text(units) == truth(dictionary, units, set())


@pytest.mark.parametrize("a, b, shared", [([], [], 0), ([1, 2], [1, 2, 3], 2), ([1, 2, 3], [1, 2], 2),
                                          ([1, 5, 3], [1, 2, 3], 1), ([4], [1], 0)])
def test_common_prefix_length(a, b, shared):
    assert common_prefix_length(a, b) == shared
