"""LODR's bigram of the training transcripts (asr/search/bigram_lm.py) and its subtraction in fusion: against hand
computations, its file, and a wide beam against enumeration of every sequence's corrected score."""
from __future__ import annotations

import math

import pytest
import torch

from ssm_fairseq.asr.search import TransducerGenerator
from ssm_fairseq.asr.search.beam_search import beam_search
from ssm_fairseq.asr.search.bigram_lm import BigramFileError, BigramLM
from ssm_fairseq.asr.search.lm_fusion import LanguageModelFusion, LanguageModelMismatchError

from test_lm_fusion import CountingBigramDecoder, bigram_lm, units
from test_transducer_search import ENCODER_DIM, exhaustive_scores, tiny_model

BLANK, EOS = 0, 2  # the dictionary's <s> (the transducer's blank) and </s>
A, B = 4, 5  # the two units of the hand-computed case
SUPPRESS = (1, 2, 3)  # <pad>, </s>, <unk>


def hand_case(add_k: float = 0.5) -> BigramLM:
    """Transcripts "a b" and "b b a" over <s> <pad> </s> <unk> a b."""
    return BigramLM.from_sequences([[A, B], [B, B, A]], units(6).symbols, add_k, EOS)


def test_add_k_probabilities_by_hand():
    """Pairs with </s> at both ends: (</s> a) (a b) (b </s>) (</s> b) (b b) (b a) (a </s>); outcomes a, b, </s>."""
    bigram = hand_case(0.5)
    assert bigram.outcomes == [EOS, A, B]
    expected = {(A, B): 1.5 / 3.5, (A, A): 0.5 / 3.5, (A, EOS): 1.5 / 3.5, (B, B): 1.5 / 4.5, (B, A): 1.5 / 4.5,
                (B, EOS): 1.5 / 4.5, (EOS, A): 1.5 / 3.5, (EOS, B): 1.5 / 3.5, (EOS, EOS): 0.5 / 3.5}
    table = bigram.log_prob_table()
    for (v, w), p in expected.items():
        assert bigram.log_prob(v, w) == pytest.approx(math.log(p), abs=1e-12)
        assert table[v, w].item() == pytest.approx(math.log(p), abs=1e-6)
    for excluded in (0, 1, 3):  # the blank, <pad>, <unk>: neither context nor outcome, 0 in the table
        assert table[excluded].abs().sum() == 0 and table[:, excluded].abs().sum() == 0


def test_the_file_round_trips_and_other_files_are_named(tmp_path):
    bigram = hand_case()
    bigram.save(tmp_path / "bigram.json")
    loaded = BigramLM.load(tmp_path / "bigram.json")
    assert torch.equal(loaded.log_prob_table(), bigram.log_prob_table()) and loaded.units == bigram.units
    (tmp_path / "other.json").write_text('{"format": "arpa"}')
    (tmp_path / "broken.json").write_text("not json")
    for name, message in (("other.json", "not a bigram file"), ("broken.json", "cannot read"),
                          ("missing.json", "cannot read")):
        with pytest.raises(BigramFileError, match=f"{name}.*{message}"):
            BigramLM.load(tmp_path / name)
    with pytest.raises(ValueError, match="add-k"):
        BigramLM.from_sequences([[A]], units(6).symbols, 0.0, EOS)


def test_fusion_subtracts_the_weighted_bigram_of_each_rows_last_label():
    """Every row's scores: W log p_lm(v | prefix) - W_ilm log P(v | last label) by hand, the blank 0; the end is
    scored by the LM alone."""
    lm, weight, ilm_weight = bigram_lm(6, seed=2), 0.7, 0.3
    bigram = hand_case()
    fusion = LanguageModelFusion(lm, weight, BLANK, EOS, ilm=bigram, ilm_weight=ilm_weight)
    start = fusion.start(2)
    rows = fusion.advance([start[0], start[1], start[0]], [A, B, B])
    rows += fusion.advance([rows[0], rows[1]], [A, B])
    prefixes = [[EOS], [EOS], [EOS, A], [EOS, B], [EOS, B], [EOS, A, A], [EOS, B, B]]
    table = lm.decoder.table
    for row, prefix in zip(start + rows, prefixes):
        got = fusion.scores([row])[0].tolist()
        assert got[BLANK] == 0.0
        for v in (A, B, EOS):
            expected = weight * CountingBigramDecoder.log_prob(table, prefix, v) - ilm_weight * bigram.log_prob(
                prefix[-1], v)
            assert got[v] == pytest.approx(expected, abs=1e-5)
        assert fusion.eos_scores([row])[0] == pytest.approx(weight * CountingBigramDecoder.log_prob(table, prefix, EOS),
                                                            abs=1e-5)


def test_a_wide_beam_with_lodr_finds_the_best_corrected_score():
    """Every sequence of a 3-frame utterance scored log P_asr + W (sum log p_lm + log p_lm(</s>)) - W_ilm sum
    log P_bigram by enumeration: the wide fused beam with LODR returns the 5 best in order, with those scores, and
    LODR changes the ranking here."""
    torch.manual_seed(1)
    model = tiny_model(vocab=6, blank=BLANK, sharpness=1.5)
    lm, weight, ilm_weight = bigram_lm(6, seed=5), 0.6, 1.0
    bigram = BigramLM.from_sequences([[A, A, A, A], [A, A, B], [A]], units(6).symbols, 0.1, EOS)
    encoder_out = torch.randn(1, 3, ENCODER_DIM, dtype=torch.float64)
    table = lm.decoder.table
    truth = {}
    for y, score in exhaustive_scores(model, encoder_out[0], 1).items():
        if any(v in SUPPRESS for v in y):
            continue
        prefix = [EOS, *y]
        lm_score = sum(CountingBigramDecoder.log_prob(table, prefix[: i + 1], prefix[i + 1]) for i in range(len(y)))
        ilm_score = sum(bigram.log_prob(prefix[i], prefix[i + 1]) for i in range(len(y)))
        truth[y] = score + weight * (lm_score + CountingBigramDecoder.log_prob(table, prefix, EOS)) - \
            ilm_weight * ilm_score
    ranked = sorted(truth.items(), key=lambda item: -item[1])[:5]

    def search(ilm_weight):
        fusion = LanguageModelFusion(lm, weight, BLANK, EOS, ilm=bigram, ilm_weight=ilm_weight)
        return beam_search(model, encoder_out, torch.tensor([3]), beam=len(truth), max_symbols_per_frame=1, nbest=5,
                           suppress=SUPPRESS, fusion=fusion)[0]

    hypotheses = search(ilm_weight)
    assert [tuple(h.tokens) for h in hypotheses] == [y for y, _ in ranked]
    assert [h.score for h in hypotheses] == pytest.approx([s for _, s in ranked], abs=1e-5)
    assert [h.tokens for h in search(0.0)] != [h.tokens for h in hypotheses]


def test_lodr_needs_a_fused_lm_and_a_bigram_over_the_same_units():
    model, lm, bigram = tiny_model(vocab=6, blank=BLANK), bigram_lm(6), hand_case()
    with pytest.raises(ValueError, match="--ilm-weight 0.2 needs a fused language model"):
        TransducerGenerator([model], units(6), beam=2, lm_model=lm, lm_weight=0.0, ilm=bigram, ilm_weight=0.2)
    with pytest.raises(ValueError, match="needs the bigram"):
        TransducerGenerator([model], units(6), beam=2, lm_model=lm, lm_weight=0.5, ilm_weight=0.2)
    with pytest.raises(ValueError, match="finite number >= 0"):
        TransducerGenerator([model], units(6), beam=2, lm_model=lm, lm_weight=0.5, ilm=bigram, ilm_weight=-1.0)
    other = BigramLM.from_sequences([[A]], [*units(6).symbols[:5], "zz"], 0.5, EOS)
    with pytest.raises(LanguageModelMismatchError, match="--ilm-path bigram's unit 5 is 'zz'"):
        TransducerGenerator([model], units(6), beam=2, lm_model=lm, lm_weight=0.5, ilm=other, ilm_weight=0.2)
    generator = TransducerGenerator([model], units(6), beam=2, lm_model=lm, lm_weight=0.5, ilm=bigram, ilm_weight=0.2)
    assert generator.search(1, torch.device("cpu")).fusion._ilm is not None
