"""Search on a trained transducer whose alignments force bursts of five labels within one encoder frame.

Each utterance is 2-4 "words" of five labels, one encoder frame per word, so every alignment emits five labels
per frame on average: more than the per-frame limit of 3 that once ruined beam search. The model is trained
here (a few seconds), then decoded with the searches' defaults.
"""
import pytest
import torch
from fairseq.data import Dictionary

from ssm_fairseq.asr.search import TransducerGenerator
from ssm_fairseq.asr.search.beam_search import beam_search
from ssm_fairseq.asr.search.greedy_search import greedy_search
from toy_transducer import BLANK, FIRST_LABEL, VOCAB, ToyTransducer, full_loss, train, utterances


@pytest.fixture(scope="module")
def trained():
    """The trained model in float64 and 12 test utterances; training drives the loss near zero."""
    torch.manual_seed(0)
    model = ToyTransducer()
    train(model, lambda *batch: full_loss(model, *batch).mean())
    model = model.double().eval()
    features, lengths, targets, target_lengths = utterances(12, torch.Generator().manual_seed(1))
    return model, features.double(), lengths, targets, target_lengths


def reference(targets, target_lengths, b):
    return targets[b, : target_lengths[b]].tolist()


def alignment_log_prob(model, features, lengths, b, tokens, frames) -> float:
    """Log-probability of one alignment, from the full forward pass: every label where ``frames`` puts it, and
    the blank that ends each frame."""
    T = int(lengths[b])
    lattice = model.lattice(features[b : b + 1, :T], lengths[b : b + 1], torch.tensor([tokens]).reshape(1, -1))[0]
    total, u = 0.0, 0
    for t in range(T):
        while u < len(tokens) and frames[u] == t:
            total += lattice[t, u, tokens[u]].item()
            u += 1
        total += lattice[t, u, BLANK].item()
    assert u == len(tokens)
    return total


def exact_log_prob(model, features, lengths, b, tokens) -> float:
    """log P(tokens | x) over the whole RNN-T lattice: minus the RNN-T loss."""
    T = int(lengths[b])
    return -full_loss(model, features[b : b + 1, :T], lengths[b : b + 1], torch.tensor([tokens]).reshape(1, -1),
                      torch.tensor([len(tokens)])).item()


def test_the_model_learned_five_label_bursts(trained):
    model, features, lengths, targets, target_lengths = trained
    for b in range(len(lengths)):
        assert exact_log_prob(model, features, lengths, b, reference(targets, target_lengths, b)) > -0.5


def test_greedy_decodes_the_bursts_and_scores_its_alignment(trained):
    model, features, lengths, targets, target_lengths = trained
    encoder_out = model.encoder(features, lengths)["encoder_out"]
    for b, hypothesis in enumerate(greedy_search(model, encoder_out, lengths)):
        assert hypothesis.tokens == reference(targets, target_lengths, b)
        assert max(hypothesis.frames.count(t) for t in set(hypothesis.frames)) >= 5
        recomputed = alignment_log_prob(model, features, lengths, b, hypothesis.tokens, hypothesis.frames)
        assert hypothesis.score == pytest.approx(recomputed, abs=1e-9)
    # the old default limit of 3 labels per frame cannot decode them: at most 3 labels per frame
    for b, hypothesis in enumerate(greedy_search(model, encoder_out, lengths, max_symbols_per_frame=3)):
        assert len(hypothesis.tokens) <= 3 * lengths[b] < target_lengths[b]


@pytest.mark.parametrize("beam", [1, 2, 4, 8])
def test_beam_search_decodes_the_bursts_at_least_as_well_as_greedy(trained, beam):
    model, features, lengths, targets, target_lengths = trained
    encoder_out = model.encoder(features, lengths)["encoder_out"]
    greedy = greedy_search(model, encoder_out, lengths)
    for b, (best,) in enumerate(beam_search(model, encoder_out, lengths, beam=beam)):
        assert best.tokens == reference(targets, target_lengths, b)
        assert best.score >= greedy[b].score - 1e-9
        recomputed = alignment_log_prob(model, features, lengths, b, best.tokens, best.frames)
        if beam == 1:  # one prefix per frame: nothing is merged, the score is that of one alignment
            assert best.score == pytest.approx(recomputed, abs=1e-9)
        else:  # the merged alignments, the best of which is the one reported
            assert recomputed <= best.score + 1e-9
        assert best.score <= exact_log_prob(model, features, lengths, b, best.tokens) + 1e-9


def test_a_wide_beam_scores_the_exact_probability(trained):
    model, features, lengths, _, _ = trained
    encoder_out = model.encoder(features, lengths)["encoder_out"]
    for b, (best,) in enumerate(beam_search(model, encoder_out, lengths, beam=64)):
        # all but the alignments the pruning leaves out, whose probability is far below 0.1% of the sequence's
        exact = exact_log_prob(model, features, lengths, b, best.tokens)
        assert exact - 1e-3 < best.score <= exact + 1e-9


def test_fairseq_generator_prints_the_model_score_and_alignment(trained):
    model, features, lengths, targets, target_lengths = trained
    dictionary = Dictionary()
    for label in range(FIRST_LABEL, VOCAB):
        dictionary.add_symbol(f"label{label}")
    assert (dictionary.bos(), len(dictionary)) == (BLANK, VOCAB)
    sample = {"net_input": {"src_tokens": features, "src_lengths": lengths}}
    for beam in (1, 4):
        generator = TransducerGenerator([model], dictionary, beam=beam)
        for b, (hypo,) in enumerate(generator.generate([model], sample)):
            *tokens, eos = hypo["tokens"].tolist()
            assert tokens == reference(targets, target_lengths, b) and eos == dictionary.eos()
            assert hypo["positional_scores"].sum().item() == pytest.approx(hypo["score"], abs=1e-4)
            frames = [frame for frame, position in hypo["alignment"]]
            assert [position for _, position in hypo["alignment"]] == list(range(len(tokens)))
            recomputed = alignment_log_prob(model, features, lengths, b, tokens, frames)
            exact = exact_log_prob(model, features, lengths, b, tokens)
            if beam == 1:  # greedy: one alignment
                assert hypo["score"] == pytest.approx(recomputed, abs=1e-9)
            else:  # the alignments merged into the hypothesis: at least the reported one, at most all of them
                assert recomputed - 1e-9 <= hypo["score"] <= exact + 1e-9
