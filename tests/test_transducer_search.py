"""Transducer search: greedy against a naive decoder, beam search against exhaustive search."""
import itertools
from types import SimpleNamespace

import pytest
import torch

from ssm_fairseq.asr.search.beam_search import beam_search
from ssm_fairseq.asr.search.greedy_search import GreedySearch, greedy_search
from ssm_fairseq.asr.search.hypothesis import SearchSettings
from ssm_fairseq.asr.transducer.joiner import Joiner
from ssm_fairseq.asr.transducer.predictor import Predictor
from ssm_fairseq.asr.transducer.rnnt_loss import rnnt_loss

ENCODER_DIM = 6


def tiny_model(vocab: int, blank: int = 0, sharpness: float = 3.0):
    """A random predictor + joiner (the parts search uses), in float64 so scores compare tightly."""
    predictor = Predictor(vocab, embed_dim=5, hidden_dim=7, layers=2, dropout=0.3)
    joiner = Joiner(ENCODER_DIM, 7, joint_dim=9, vocab_size=vocab)
    with torch.no_grad():
        joiner.output.weight.mul_(sharpness)
    model = SimpleNamespace(predictor=predictor.double().eval(), joiner=joiner.double(), blank=blank)
    return model


def lattice_log_probs(model, encoder_out: torch.Tensor, labels: list[int]) -> torch.Tensor:
    """``T x (U+1) x V`` log-probabilities for one utterance, the predictor run on the whole label history."""
    history = torch.tensor([[model.blank] + labels])
    predictor_out, _ = model.predictor(history)
    return model.joiner(encoder_out[None], predictor_out)[0].log_softmax(-1)


def naive_greedy(model, encoder_out: torch.Tensor, max_symbols: int, suppress=(),
                 frames: list[int] | None = None) -> tuple[list[int], float]:
    """Frame by frame, one utterance, recomputing the lattice from the full history at every step; after
    ``max_symbols`` labels in a frame, on to the next frame without a blank. Each label's frame is appended to
    ``frames`` if given."""
    labels, score = [], 0.0
    for t in range(encoder_out.shape[0]):
        for _ in range(max_symbols):
            log_probs = lattice_log_probs(model, encoder_out, labels)[t, len(labels)]
            best = max((v for v in range(len(log_probs)) if v not in suppress), key=lambda v: log_probs[v])
            score += log_probs[best].item()
            if best == model.blank:
                break
            labels.append(best)
            if frames is not None:
                frames.append(t)
    return labels, score


def exhaustive_scores(model, encoder_out: torch.Tensor, max_symbols: int) -> dict[tuple[int, ...], float]:
    """log P(y) for every y, summed over every path of the search's topology: each frame emits ``n`` labels,
    then a blank if ``n < max_symbols``; with ``n == max_symbols`` it moves on without one."""
    T, V = encoder_out.shape[0], model.joiner.output.out_features
    labels = [v for v in range(V) if v != model.blank]
    scores = {}
    for length in range(T * max_symbols + 1):
        for y in itertools.product(labels, repeat=length):
            log_probs = lattice_log_probs(model, encoder_out, list(y))
            paths = []
            for counts in itertools.product(range(max_symbols + 1), repeat=T):
                if sum(counts) != length:
                    continue
                u, total = 0, 0.0
                for t, n in enumerate(counts):
                    for _ in range(n):
                        total += log_probs[t, u, y[u]].item()
                        u += 1
                    if n < max_symbols:
                        total += log_probs[t, u, model.blank].item()
                paths.append(total)
            scores[y] = torch.logsumexp(torch.tensor(paths, dtype=torch.float64), 0).item()
    return scores


def rnnt_log_prob(model, encoder_out: torch.Tensor, y: tuple[int, ...]) -> float:
    """log P(y | x) over the full RNN-T lattice (any number of labels per frame): minus the RNN-T loss."""
    logits = model.joiner(encoder_out[None], model.predictor(torch.tensor([[model.blank, *y]]))[0])
    nll = rnnt_loss(logits, torch.tensor([y], dtype=torch.long).reshape(1, -1),
                    torch.tensor([encoder_out.shape[0]]), torch.tensor([len(y)]), blank=model.blank,
                    backend="pytorch")
    return -nll.item()


@pytest.mark.parametrize("frames_per_round", [1, 3, 8])
@pytest.mark.parametrize("max_symbols,suppress", [(1, ()), (2, ()), (3, ()), (2, (1, 4))])
def test_greedy_equals_naive_decoder(max_symbols, suppress, frames_per_round):
    """Frame by frame, one utterance at a time, against the batch's utterances each scoring several frames ahead
    per round (a window of 1, 3 and 8 of the 9 frames)."""
    model = tiny_model(vocab=6, blank=2)
    encoder_out = torch.randn(4, 9, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([9, 4, 0, 7])
    hypotheses = greedy_search(model, encoder_out, lengths, max_symbols, suppress, frames_per_round=frames_per_round)
    emitted_somewhere = 0
    for b, hypothesis in enumerate(hypotheses):
        frames = []
        labels, score = naive_greedy(model, encoder_out[b, : lengths[b]], max_symbols, suppress, frames)
        assert hypothesis.tokens == labels
        assert hypothesis.score == pytest.approx(score, abs=1e-9)
        assert len(hypothesis.token_scores) == len(hypothesis.frames) == len(labels)
        assert hypothesis.frames == sorted(hypothesis.frames) and all(0 <= t < lengths[b] for t in hypothesis.frames)
        assert hypothesis.frames == frames
        emitted_somewhere += len(labels)
    assert emitted_somewhere > 0  # the random model does emit labels, so the comparison means something


@pytest.mark.parametrize("frames_per_round", [1, 2, 8])
def test_greedy_rounds_follow_the_labels_not_the_frames(frames_per_round):
    """Each round an utterance emits a label or moves ``frames_per_round`` frames on (or to its end), so a batch
    takes at most ``max(labels + ceil(frames / W))`` rounds over its utterances, not one per frame and label."""
    torch.manual_seed(5)
    model = tiny_model(vocab=6, blank=2)
    encoder_out = torch.randn(3, 40, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([40, 25, 33])
    search = GreedySearch(model, 3, encoder_out.device, SearchSettings(2), frames_per_round=frames_per_round)
    search.advance(encoder_out, lengths)
    labels = [len(tokens) for tokens in search.tokens]
    assert min(labels) >= 3
    assert search.rounds <= max(n + -(-int(T) // frames_per_round) for n, T in zip(labels, lengths))
    with pytest.raises(ValueError, match="frames_per_round"):
        GreedySearch(model, 3, encoder_out.device, frames_per_round=0)


@pytest.mark.parametrize("max_symbols", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_finds_the_most_probable_sequence(max_symbols, seed):
    torch.manual_seed(seed)
    model = tiny_model(vocab=3, blank=0, sharpness=1.5)
    encoder_out = torch.randn(1, 3, ENCODER_DIM, dtype=torch.float64)
    truth = exhaustive_scores(model, encoder_out[0], max_symbols)
    # each frame stops after a blank or at the limit: the paths form one probability distribution, also when the
    # model would go on emitting (bursts longer than the limit) and the search moves on without a blank
    assert torch.logsumexp(torch.tensor(list(truth.values()), dtype=torch.float64), 0).item() == pytest.approx(0.0, abs=1e-9)
    ranked = sorted(truth.items(), key=lambda item: -item[1])
    hypotheses = beam_search(model, encoder_out, torch.tensor([3]), beam=len(truth), max_symbols_per_frame=max_symbols,
                             nbest=5)[0]
    assert [tuple(h.tokens) for h in hypotheses] == [y for y, _ in ranked[:5]]
    for hypothesis, (_, score) in zip(hypotheses, ranked):
        assert hypothesis.score == pytest.approx(score, abs=1e-9)
    # A sequence shorter than the limit never meets it: its score is the full RNN-T probability.
    for y, score in truth.items():
        if len(y) < max_symbols:
            assert score == pytest.approx(rnnt_log_prob(model, encoder_out[0], y), abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_default_limit_wide_beam_scores_exact_rnnt_probabilities(seed):
    """With the default limit nothing binds: the scores of a wide beam are RNN-T probabilities, ranked."""
    torch.manual_seed(seed)
    model = tiny_model(vocab=3, blank=0, sharpness=1.5)
    encoder_out = torch.randn(1, 3, ENCODER_DIM, dtype=torch.float64)
    hypotheses = beam_search(model, encoder_out, torch.tensor([3]), beam=200, nbest=5)[0]
    scores = [rnnt_log_prob(model, encoder_out[0], tuple(h.tokens)) for h in hypotheses]
    assert [h.score for h in hypotheses] == pytest.approx(scores, abs=1e-6)
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("beam", [2, 4])
def test_batched_beam_search_equals_one_utterance_at_a_time(beam):
    model = tiny_model(vocab=7, blank=0)
    encoder_out = torch.randn(3, 8, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([8, 5, 1])
    batched = beam_search(model, encoder_out, lengths, beam=beam, max_symbols_per_frame=2, nbest=beam)
    for b in range(3):
        alone = beam_search(model, encoder_out[b : b + 1, : lengths[b]], lengths[b : b + 1], beam=beam,
                            max_symbols_per_frame=2, nbest=beam)[0]
        assert [h.tokens for h in batched[b]] == [h.tokens for h in alone]
        assert [h.score for h in batched[b]] == pytest.approx([h.score for h in alone], abs=1e-9)


def test_beam_search_is_at_least_as_good_as_greedy():
    model = tiny_model(vocab=6, blank=0)
    encoder_out = torch.randn(5, 10, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.full((5,), 10)
    greedy = greedy_search(model, encoder_out, lengths, 1)
    beams = beam_search(model, encoder_out, lengths, beam=8, max_symbols_per_frame=1)
    for g, (best,) in zip(greedy, beams):
        assert best.score >= g.score - 1e-9  # merging only adds probability to the greedy path's prefix


def test_suppressed_units_are_never_emitted():
    model = tiny_model(vocab=6, blank=0, sharpness=4.0)
    encoder_out = torch.randn(4, 10, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.full((4,), 10)
    emitted = {u for h in greedy_search(model, encoder_out, lengths) for u in h.tokens}
    assert len(emitted) >= 2  # the model does emit several units when free to
    suppress = sorted(emitted)[:2]
    for hypothesis in greedy_search(model, encoder_out, lengths, suppress=suppress):
        assert not set(hypothesis.tokens) & set(suppress)
    for hypotheses in beam_search(model, encoder_out, lengths, beam=4, nbest=4, suppress=suppress):
        for hypothesis in hypotheses:
            assert not set(hypothesis.tokens) & set(suppress)


def test_length_normalised_ranking():
    model = tiny_model(vocab=5, blank=0)
    encoder_out = torch.randn(3, 6, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.full((3,), 6)
    plain = beam_search(model, encoder_out, lengths, beam=6, nbest=6)
    normalised = beam_search(model, encoder_out, lengths, beam=6, nbest=6, length_norm=1.0)
    for p, n in zip(plain, normalised):
        assert [h.score for h in p] == sorted((h.score for h in p), reverse=True)
        assert [h.score / (len(h.tokens) + 1) for h in n] == sorted(
            (h.score / (len(h.tokens) + 1) for h in n), reverse=True)
        # the same hypotheses with the same scores, only ranked differently
        assert sorted((tuple(h.tokens), h.score) for h in p) == sorted((tuple(h.tokens), h.score) for h in n)


def test_bad_search_arguments_are_rejected():
    model = tiny_model(vocab=3)
    encoder_out, lengths = torch.randn(1, 2, ENCODER_DIM, dtype=torch.float64), torch.tensor([2])
    with pytest.raises(ValueError, match="max_symbols_per_frame"):
        greedy_search(model, encoder_out, lengths, 0)
    with pytest.raises(ValueError, match="nbest"):
        beam_search(model, encoder_out, lengths, beam=2, nbest=3)
    with pytest.raises(ValueError, match="blank"):
        beam_search(model, encoder_out, lengths, beam=2, suppress=[model.blank])


@pytest.mark.parametrize("penalty", [0.7, 2.5])
def test_blank_penalty_is_a_lower_blank_logit(penalty):
    """Searching with --blank-penalty P equals searching the model whose blank logit is lower by P."""
    torch.manual_seed(3)
    model = tiny_model(vocab=5)
    penalised = tiny_model(vocab=5)
    penalised.predictor.load_state_dict(model.predictor.state_dict())
    penalised.joiner.load_state_dict(model.joiner.state_dict())
    with torch.no_grad():
        penalised.joiner.output.bias[model.blank] -= penalty
    encoder_out = torch.randn(2, 6, ENCODER_DIM, dtype=torch.float64)
    lengths = torch.tensor([6, 4])
    for search in (lambda m, **kw: greedy_search(m, encoder_out, lengths, 2, **kw),
                   lambda m, **kw: beam_search(m, encoder_out, lengths, 3, 2, nbest=3, **kw)):
        assert search(model, blank_penalty=penalty) == search(penalised)
        assert search(model, blank_penalty=penalty) != search(model)  # it changes the search
