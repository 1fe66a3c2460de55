"""Language-model fusion batched across hypotheses and utterances: a batch decodes as each utterance alone, the LM
runs in as few calls as its states allow (one per round for an LSTM and spade_lm, whatever the prefix lengths), a
weight of 0 never runs the LM, and a search fed its frames in chunks (streaming) returns what one call over them
returns."""
from __future__ import annotations

import pytest
import torch

from ssm_fairseq.asr.search import TransducerGenerator
from ssm_fairseq.asr.search.beam_search import BeamSearch, beam_search
from ssm_fairseq.asr.search.greedy_search import GreedySearch, greedy_search
from ssm_fairseq.asr.search.hypothesis import SearchSettings
from ssm_fairseq.asr.search.lm_fusion import LanguageModelFusion

from test_lm_fusion import BLANK, LM_VOCAB, bigram_lm, language_model, units
from test_transducer_search import ENCODER_DIM, tiny_model

EOS = 2  # the real LMs' </s> (fairseq's dictionary), suppressed in search with <pad> and <unk>
SUPPRESS = (1, 2, 3)
SEARCHES = {  # name -> (beam, labels per frame); beam 1 is greedy search
    "greedy": (1, 2), "beam": (3, 2), "modified beam": (3, 1),
}
# spade_lm's step is the slowest of the three: it is checked with modified beam search, the full forward pass of its
# branched and dropped states in test_lm_fusion.py
CASES = [(search, arch) for search in SEARCHES for arch in ("lstm_lm", "transformer_lm")] + [("modified beam",
                                                                                            "spade_lm")]


def emitting_model():
    """A tiny transducer over the LMs' units that emits labels often (a lower blank logit)."""
    model = tiny_model(vocab=LM_VOCAB, blank=BLANK, sharpness=2.0)
    with torch.no_grad():
        model.joiner.output.bias[BLANK] -= 5.0
    return model


def decode(model, encoder_out, lengths, search: str, fusion):
    """Each utterance's hypotheses (3 for beam searches, 1 for greedy) as (tokens, score) pairs."""
    beam, limit = SEARCHES[search]
    if beam == 1:
        return [[(h.tokens, h.score)] for h in greedy_search(model, encoder_out, lengths, limit, SUPPRESS,
                                                             fusion=fusion)]
    return [[(h.tokens, h.score) for h in hypotheses]
            for hypotheses in beam_search(model, encoder_out, lengths, beam, limit, nbest=beam, suppress=SUPPRESS,
                                          fusion=fusion)]


def assert_same_hypotheses(got, expected):
    assert [[tokens for tokens, _ in hypotheses] for hypotheses in got] == \
        [[tokens for tokens, _ in hypotheses] for hypotheses in expected]
    for g, e in zip(got, expected):
        assert [score for _, score in g] == pytest.approx([score for _, score in e], abs=1e-5)


@pytest.mark.parametrize("search, arch", CASES)
def test_batched_fused_search_equals_each_utterance_alone(search, arch):
    """Hypotheses of different utterances and lengths share LM calls; each still gets its own LM's scores."""
    torch.manual_seed(11)
    model, lm = emitting_model(), language_model(arch)
    encoder_out = torch.randn(4, 9, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([9, 3, 7, 1])
    fusion = LanguageModelFusion(lm, 0.7, BLANK, EOS)
    batched = decode(model, encoder_out, lengths, search, fusion)
    alone = [decode(model, encoder_out[b:b + 1, :lengths[b]], lengths[b:b + 1], search,
                    LanguageModelFusion(lm, 0.7, BLANK, EOS))[0] for b in range(4)]
    assert_same_hypotheses(batched, alone)
    assert max(len(tokens) for hypotheses in batched for tokens, _ in hypotheses) >= 4
    assert batched != decode(model, encoder_out, lengths, search, None)  # the LM changes the scores


class CountingLanguageModel:
    """Wraps a fairseq LM and counts the prefix lengths of every incremental step it takes (``forward``, and a token
    store's ``step_rows``: spade_lm's)."""

    def __init__(self, lm):
        self.lm, self.steps = lm, []
        forward, step_rows = lm.decoder.forward, getattr(lm.decoder, "step_rows", None)

        def counted(tokens, *args, **kwargs):
            self.steps.append(sorted({int((row != lm.decoder.dictionary.pad()).sum()) for row in tokens}))
            return forward(tokens, *args, **kwargs)
        lm.decoder.forward = counted
        if step_rows is not None:
            def counted_rows(tokens, seen, *args, **kwargs):
                self.steps.append(sorted(set((seen + 1).tolist())))
                return step_rows(tokens, seen, *args, **kwargs)
            lm.decoder.step_rows = counted_rows


@pytest.mark.parametrize("search", ["beam", "modified beam"])
def test_lm_steps_once_per_round_whatever_the_prefix_lengths(search):
    """lstm_lm (a fixed-size state) and spade_lm (its token store: windows as index lists, a per-row key mask): the
    rows whose scores a round asks for step in one LM call, with prefixes of several lengths in it; transformer_lm
    (whose keys and values grow with the prefix): one call per length. The steps wait until a round asks for the rows'
    scores, so hypotheses dropped before that never run the LM: fewer rows step than the search made."""
    torch.manual_seed(12)
    model = tiny_model(vocab=LM_VOCAB, blank=BLANK, sharpness=2.0)  # blanks too: prefixes of several lengths
    with torch.no_grad():
        model.joiner.output.bias[BLANK] -= 1.0  # labels often enough that rows of several lengths wait together
    encoder_out = torch.randn(3, 8, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([8, 6, 5])
    beam, limit = SEARCHES[search]
    for arch in ("lstm_lm", "spade_lm", "transformer_lm"):
        counting = CountingLanguageModel(language_model(arch))
        fusion = LanguageModelFusion(counting.lm, 0.5, BLANK, EOS)
        made, rounds = [], []  # rows the search made (fusion.advance); rows stepped together (states.advance)
        advance, step = fusion.advance, fusion.states.advance
        fusion.advance = lambda rows, labels: made.append(len(rows)) or advance(rows, labels)
        fusion.states.advance = lambda rows, labels: rounds.append(len(rows)) or step(rows, labels)
        beam_search(model, encoder_out, lengths, beam, limit, suppress=SUPPRESS, fusion=fusion)
        assert len(rounds) >= 4
        assert sum(rounds) < sum(made)
        steps = counting.steps[1:]  # the first fed </s> to every utterance
        if arch != "transformer_lm":
            assert len(steps) == len(rounds)
            assert max(len(step) for step in steps) >= 2  # rows of different lengths stepped together
        else:
            assert all(len(step) == 1 for step in steps)
            assert len(steps) > len(rounds)


class RaisingDecoder(torch.nn.Module):
    """An LM decoder that must never run."""

    def __init__(self, dictionary):
        super().__init__()
        self.dictionary = dictionary
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, *args, **kwargs):
        raise AssertionError("the language model ran at weight 0")


class NeverRunLanguageModel(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.decoder = RaisingDecoder(units(vocab))

    def forward(self, *args, **kwargs):
        raise AssertionError("the language model ran at weight 0")

    def get_normalized_probs(self, *args, **kwargs):
        raise AssertionError("the language model ran at weight 0")


@pytest.mark.parametrize("search", SEARCHES)
def test_weight_zero_never_runs_the_language_model(search):
    torch.manual_seed(13)
    model = emitting_model()
    encoder_out = torch.randn(2, 6, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([6, 4])
    fused = decode(model, encoder_out, lengths, search, LanguageModelFusion(NeverRunLanguageModel(LM_VOCAB), 0.0,
                                                                            BLANK, EOS))
    assert fused == decode(model, encoder_out, lengths, search, None)
    beam, limit = SEARCHES[search]
    generator = TransducerGenerator([model], units(LM_VOCAB), beam=beam, nbest=1, max_symbols_per_frame=limit,
                                    lm_model=NeverRunLanguageModel(LM_VOCAB), lm_weight=0.0)
    hypotheses = generator.search(2, encoder_out.device)
    assert hypotheses.fusion is None
    hypotheses.advance(encoder_out, lengths)
    assert [h[0].tokens for h in hypotheses.finish()] == [h[0][0] for h in fused]


def chunked(search, encoder_out, lengths, chunk: int):
    """Feed ``search`` the frames ``chunk`` at a time, as a stream arrives -> its finished hypotheses."""
    for start in range(0, encoder_out.shape[1], chunk):
        frames = encoder_out[:, start:start + chunk]
        search.advance(frames, (lengths - start).clamp(0, frames.shape[1]))
    return search.finish(nbest=search.beam if isinstance(search, BeamSearch) else 1)


@pytest.mark.parametrize("search, arch", [(search, "bigram") for search in SEARCHES] + [("greedy", "spade_lm")])
def test_fused_search_fed_in_chunks_equals_one_call(search, arch):
    """Streaming with an LM: the LM states and scores carry from chunk to chunk, so any chunking gives the
    hypotheses (tokens, frames, fused scores) of one call over the whole encoder output."""
    torch.manual_seed(14)
    model = emitting_model()
    encoder_out = torch.randn(2, 9, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([9, 6])
    lm = bigram_lm(LM_VOCAB, seed=4) if arch == "bigram" else language_model(arch)
    beam, limit = SEARCHES[search]
    settings = SearchSettings(limit, SUPPRESS)

    def new_search():
        fusion = LanguageModelFusion(lm, 0.6, BLANK, EOS)
        if beam == 1:
            return GreedySearch(model, 2, encoder_out.device, settings, fusion)
        return BeamSearch(model, 2, encoder_out.device, beam, settings, fusion)

    whole = chunked(new_search(), encoder_out, lengths, encoder_out.shape[1])
    assert any(h.tokens for hypotheses in whole for h in hypotheses)
    for chunk in (1, 4):  # one frame at a time, and several
        streamed = chunked(new_search(), encoder_out, lengths, chunk)
        for s, w in zip(streamed, whole):
            assert [h.tokens for h in s] == [h.tokens for h in w]
            assert [h.frames for h in s] == [h.frames for h in w]
            assert [h.score for h in s] == pytest.approx([h.score for h in w], abs=1e-5)
