"""Shallow fusion of a language model into transducer search: against enumeration with a known LM, against the
LM's full forward pass (spade_lm, transformer_lm, lstm_lm), and unchanged search at weight 0."""
from __future__ import annotations

import random
import re

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import FairseqIncrementalDecoder, FairseqLanguageModel

from ssm_fairseq.asr.search import TransducerGenerator
from ssm_fairseq.asr.search.beam_search import beam_search
from ssm_fairseq.asr.search.greedy_search import greedy_search
from ssm_fairseq.asr.search.lm_fusion import LanguageModelFusion, LanguageModelMismatchError, \
    LanguageModelWeightError, NotALanguageModelError, check_same_units

from spade_cases import SMALL, build
from test_transducer_search import ENCODER_DIM, exhaustive_scores, lattice_log_probs, tiny_model

BLANK, EOS = 0, 3  # the tiny transducers' blank, and the unit the LM reads as </s> (suppressed in search)


class CountingBigramDecoder(FairseqIncrementalDecoder):
    """A known LM: ``log p(v | prefix) = log_softmax(table[prefix[-1], sum(prefix) % 3])[v]``, the prefix starting
    with ``</s>``. Incrementally the sum is carried in the incremental state, not re-read from the tokens, so a
    state reordered wrongly gives other scores."""

    def __init__(self, dictionary, table: torch.Tensor):
        super().__init__(dictionary)
        self.table = torch.nn.Parameter(table, requires_grad=False)

    def forward(self, prev_output_tokens, incremental_state=None, **unused):
        if incremental_state is None:
            sums = prev_output_tokens.cumsum(1)
            return self.table[prev_output_tokens, sums % 3], None
        state = self.get_incremental_state(incremental_state, "sum")
        last = prev_output_tokens[:, -1]
        total = last if state is None else state["sum"] + last
        self.set_incremental_state(incremental_state, "sum", {"sum": total})
        return self.table[last, total % 3].unsqueeze(1), None

    def reorder_incremental_state(self, incremental_state, new_order):
        state = self.get_incremental_state(incremental_state, "sum")
        if state is not None:
            self.set_incremental_state(incremental_state, "sum", {"sum": state["sum"].index_select(0, new_order)})

    @staticmethod
    def log_prob(table: torch.Tensor, prefix: list[int], unit: int) -> float:
        return table[prefix[-1], sum(prefix) % 3].log_softmax(-1)[unit].item()


def units(vocab: int) -> Dictionary:
    """A fairseq dictionary of ``vocab`` units (<s>, <pad>, </s>, <unk>, then u4, u5, ...)."""
    dictionary = Dictionary()
    for n in range(4, vocab):
        dictionary.add_symbol(f"u{n}")
    return dictionary


def bigram_lm(vocab: int, seed: int = 0, sharpness: float = 2.0) -> FairseqLanguageModel:
    table = torch.randn(vocab, 3, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return FairseqLanguageModel(CountingBigramDecoder(units(max(vocab, 4)), sharpness * table)).eval()


def fused_truth(model, encoder_out, lm, weight: float, max_symbols: int) -> dict[tuple[int, ...], float]:
    """log P_asr(y | x) + W (sum_i log p_lm(y_i | y_<i) + log p_lm(</s> | y)) for every y without </s>."""
    table = lm.decoder.table
    truth = {}
    for y, score in exhaustive_scores(model, encoder_out, max_symbols).items():
        if EOS in y:
            continue
        prefix = [EOS] + list(y)
        lm_score = sum(CountingBigramDecoder.log_prob(table, prefix[: i + 1], prefix[i + 1]) for i in range(len(y)))
        truth[y] = score + weight * (lm_score + CountingBigramDecoder.log_prob(table, prefix, EOS))
    return truth


@pytest.mark.parametrize("max_symbols", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_wide_fused_beam_finds_the_best_fused_score(max_symbols, seed):
    torch.manual_seed(seed)
    model = tiny_model(vocab=4, blank=BLANK, sharpness=1.5)
    lm = bigram_lm(4, seed)
    encoder_out = torch.randn(1, 3, ENCODER_DIM, dtype=torch.float64)
    weight = 0.8
    truth = fused_truth(model, encoder_out[0], lm, weight, max_symbols)
    ranked = sorted(truth.items(), key=lambda item: -item[1])
    fusion = LanguageModelFusion(lm, weight, BLANK, EOS)
    hypotheses = beam_search(model, encoder_out, torch.tensor([3]), beam=len(truth), max_symbols_per_frame=max_symbols,
                             nbest=5, suppress=[EOS], fusion=fusion)[0]
    assert [tuple(h.tokens) for h in hypotheses] == [y for y, _ in ranked[:5]]
    assert [h.score for h in hypotheses] == pytest.approx([s for _, s in ranked[:5]], abs=1e-5)
    # the LM changes the answer here: without it the ranking differs
    plain = beam_search(model, encoder_out, torch.tensor([3]), beam=len(truth), max_symbols_per_frame=max_symbols,
                        nbest=5, suppress=[EOS])[0]
    assert [h.tokens for h in plain] != [h.tokens for h in hypotheses]


def naive_fused_greedy(model, encoder_out, lm_log_prob, weight: float, max_symbols: int, suppress,
                       eos: int = EOS) -> tuple:
    """Greedy search recomputing the lattice and the LM from the whole history at every step."""
    labels, score = [], 0.0
    for t in range(encoder_out.shape[0]):
        for _ in range(max_symbols):
            log_probs = lattice_log_probs(model, encoder_out, labels)[t, len(labels)]
            lm = lm_log_prob([eos] + labels)
            fused = {v: log_probs[v].item() + (0.0 if v == BLANK else weight * lm[v]) for v in range(len(log_probs))}
            best = max((v for v in fused if v not in suppress), key=fused.get)
            score += fused[best]
            if best == BLANK:
                break
            labels.append(best)
    return labels, score + weight * lm_log_prob([eos] + labels)[eos]


def full_forward_log_probs(lm):
    """prefix -> the LM's next-unit log-probabilities from its full (non-incremental) forward pass, as floats."""
    def log_prob(prefix: list[int]) -> list[float]:
        with torch.no_grad():
            out = lm.decoder(torch.tensor([prefix]))
            return lm.get_normalized_probs(out, log_probs=True)[0, -1].double().tolist()
    return log_prob


@pytest.mark.parametrize("frames_per_round", [1, 4, 8])
def test_fused_greedy_equals_naive_fused_greedy(frames_per_round):
    """Greedy search scoring several frames ahead per round with the LM's scores of the labels so far against
    frame by frame with the LM's full forward pass."""
    torch.manual_seed(4)
    model = tiny_model(vocab=7, blank=BLANK)
    lm = bigram_lm(7, seed=3)
    encoder_out = torch.randn(4, 9, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([9, 4, 0, 7])
    suppress = (1, EOS)
    hypotheses = greedy_search(model, encoder_out, lengths, 2, suppress,
                               fusion=LanguageModelFusion(lm, 0.6, BLANK, EOS), frames_per_round=frames_per_round)
    for b, hypothesis in enumerate(hypotheses):
        labels, score = naive_fused_greedy(model, encoder_out[b, : lengths[b]], full_forward_log_probs(lm), 0.6, 2,
                                           suppress)
        assert hypothesis.tokens == labels
        assert hypothesis.score == pytest.approx(score, abs=1e-5)
    assert sum(len(h.tokens) for h in hypotheses) > 0


def test_weight_zero_is_todays_search():
    torch.manual_seed(5)
    model = tiny_model(vocab=7, blank=BLANK)
    encoder_out = torch.randn(3, 8, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([8, 5, 1])
    for search in (lambda **kw: greedy_search(model, encoder_out, lengths, 2, (EOS,), **kw),
                   lambda **kw: beam_search(model, encoder_out, lengths, 4, 2, nbest=3, suppress=(EOS,), **kw),
                   lambda **kw: beam_search(model, encoder_out, lengths, 4, 1, nbest=3, suppress=(EOS,), **kw)):
        assert search(fusion=LanguageModelFusion(bigram_lm(7), 0.0, BLANK, EOS)) == search()
        assert search(fusion=LanguageModelFusion(bigram_lm(7), 0.5, BLANK, EOS)) != search()


def test_batched_fused_beam_equals_one_utterance_at_a_time():
    torch.manual_seed(6)
    model = tiny_model(vocab=7, blank=BLANK)
    encoder_out = torch.randn(3, 8, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([8, 5, 1])
    lm = bigram_lm(7, seed=1)
    batched = beam_search(model, encoder_out, lengths, 4, 2, nbest=4, suppress=(EOS,),
                          fusion=LanguageModelFusion(lm, 0.7, BLANK, EOS))
    for b in range(3):
        alone = beam_search(model, encoder_out[b:b + 1, : lengths[b]], lengths[b:b + 1], 4, 2, nbest=4,
                            suppress=(EOS,), fusion=LanguageModelFusion(lm, 0.7, BLANK, EOS))[0]
        assert [h.tokens for h in batched[b]] == [h.tokens for h in alone]
        assert [h.score for h in batched[b]] == pytest.approx([h.score for h in alone], abs=1e-6)


def test_without_lm_eos_the_end_is_not_scored():
    model = tiny_model(vocab=7, blank=BLANK)
    encoder_out = torch.randn(2, 6, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([6, 6])
    lm = bigram_lm(7, seed=2)
    with_eos = greedy_search(model, encoder_out, lengths, fusion=LanguageModelFusion(lm, 0.5, BLANK, EOS))
    without = greedy_search(model, encoder_out, lengths, fusion=LanguageModelFusion(lm, 0.5, BLANK, EOS, add_eos=False))
    for a, b in zip(with_eos, without):
        assert a.tokens == b.tokens  # greedy's choices never see the end
        prefix = [EOS] + a.tokens
        assert a.score - b.score == pytest.approx(0.5 * CountingBigramDecoder.log_prob(lm.decoder.table, prefix, EOS),
                                                  abs=1e-6)


# --- spade_lm and fairseq's language models: their incremental states in the fusion's bank against the full pass

LM_FLAGS = {
    "spade_lm": SMALL,
    "transformer_lm": ("--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
                       "--decoder-attention-heads", "4", "--dropout", "0"),
    "lstm_lm": ("--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-hidden-size", "32",
                "--decoder-out-embed-dim", "32", "--dropout", "0"),
}
LM_VOCAB = 12


def language_model(arch: str):
    return build(arch, *LM_FLAGS[arch], vocab_size=LM_VOCAB)[0].eval()


@pytest.mark.parametrize("arch", LM_FLAGS)
def test_bank_scores_equal_the_full_forward_pass(arch):
    """Rows advanced, branched (one prefix extended by several labels) and dropped at random, as a search does:
    each row's scores are those of the LM's full forward pass over its prefix."""
    lm = language_model(arch)
    fusion = LanguageModelFusion(lm, 1.0, blank=0, eos=2)
    full = full_forward_log_probs(lm)
    rng = random.Random(0)
    prefixes = {row: [2] for row in fusion.start(3)}
    for step in range(12):
        parents = rng.choices(list(prefixes), k=rng.randint(1, 5))
        labels = [rng.randrange(4, LM_VOCAB) for _ in parents]
        for row, parent, label in zip(fusion.advance(parents, labels), parents, labels):
            prefixes[row] = prefixes[parent] + [label]
        if step % 3 == 2:
            kept = rng.sample(list(prefixes), k=max(1, len(prefixes) // 2))
            renumber = fusion.keep(kept)
            prefixes = {renumber[row]: prefixes[row] for row in kept}
    assert max(len(p) for p in prefixes.values()) >= 4
    for row, prefix in prefixes.items():
        expected = full(prefix)
        got = fusion.scores([row])[0].tolist()
        assert got[0] == 0.0  # the blank is never scored by the LM
        assert got[1:] == pytest.approx(expected[1:], abs=1e-5)
        assert fusion.eos_scores([row])[0] == pytest.approx(expected[2], abs=1e-5)


@pytest.mark.parametrize("arch, frames_per_round", [("spade_lm", 1), ("spade_lm", 8), ("transformer_lm", 8)])
def test_fused_greedy_with_a_real_lm_equals_naive_fused_greedy(arch, frames_per_round):
    torch.manual_seed(7)
    model = tiny_model(vocab=LM_VOCAB, blank=BLANK, sharpness=2.0)
    with torch.no_grad():
        model.joiner.output.bias[BLANK] -= 3.0  # a model that emits labels
    lm = language_model(arch)
    encoder_out = torch.randn(3, 7, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([7, 5, 3])
    suppress = (1, 2, 3)
    hypotheses = greedy_search(model, encoder_out, lengths, 2, suppress,
                               fusion=LanguageModelFusion(lm, 0.9, BLANK, eos=2), frames_per_round=frames_per_round)
    for b, hypothesis in enumerate(hypotheses):
        labels, score = naive_fused_greedy(model, encoder_out[b, : lengths[b]], full_forward_log_probs(lm), 0.9, 2,
                                           suppress, eos=2)
        assert hypothesis.tokens == labels
        assert hypothesis.score == pytest.approx(score, abs=1e-4)
    assert sum(len(h.tokens) for h in hypotheses) > 0


def test_a_language_model_over_other_units_is_refused():
    asr = units(8)
    check_same_units(units(8), asr)
    with pytest.raises(LanguageModelMismatchError, match="9 units and the transducer 8"):
        check_same_units(units(9), asr)
    other = Dictionary()
    for symbol in ["u4", "u5", "x6", "u7"]:
        other.add_symbol(symbol)
    with pytest.raises(LanguageModelMismatchError, match="unit 6 is 'x6' where the transducer's is 'u6'"):
        check_same_units(other, asr)


def test_padding_and_a_first_difference_with_other_sizes_are_named():
    asr = units(6)
    padded = units(6)
    padded.pad_to_multiple_(8)  # as fairseq-preprocess pads a dictionary it builds
    with pytest.raises(LanguageModelMismatchError, match=re.escape(
            "has 8 units and the transducer 6, the first 6 the same; the rest are 2 madeupword symbols")):
        check_same_units(padded, asr)
    longer = Dictionary()
    for symbol in ["u5", "u4", "u6"]:
        longer.add_symbol(symbol)
    with pytest.raises(LanguageModelMismatchError, match=re.escape(
            "unit 4 is 'u5' where the transducer's is 'u4' (7 units, the transducer 6)")):
        check_same_units(longer, asr)


@pytest.mark.parametrize("weight", [-0.5, float("inf"), float("nan")])
def test_a_negative_or_non_finite_weight_is_refused(weight):
    with pytest.raises(LanguageModelWeightError, match=f"--lm-weight must be a finite number >= 0 .*got {weight}"):
        LanguageModelFusion(bigram_lm(7), weight, BLANK, EOS)
    with pytest.raises(LanguageModelWeightError, match="--lm-weight must be a finite number >= 0"):
        TransducerGenerator([tiny_model(vocab=7, blank=BLANK)], units(7), lm_model=bigram_lm(7), lm_weight=weight)


def test_a_weight_whose_fused_scores_overflow_is_named():
    """1e38 times log-probabilities below -3.4 leaves float32's range: the weight is named, not the model or audio."""
    fusion = LanguageModelFusion(bigram_lm(7, sharpness=20.0), 1e38, BLANK, EOS)
    with pytest.raises(LanguageModelWeightError, match=r"--lm-weight 1e\+38 is too large: .* beyond float32's range"):
        fusion.start(1)


def test_a_model_that_is_no_language_model_is_refused():
    transducer = tiny_model(vocab=7, blank=BLANK)
    with pytest.raises(NotALanguageModelError, match="is a .*, not a fairseq language model"):
        TransducerGenerator([transducer], units(7), lm_model=tiny_model(vocab=7, blank=BLANK), lm_weight=0.5)
