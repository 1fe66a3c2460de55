"""Pruned RNN-T loss: the simple loss, pruning bounds and pruned loss against the full lattice."""
import pytest
import torch

from ssm_fairseq.asr.transducer.joiner import Joiner
from ssm_fairseq.asr.transducer.pruned_rnnt_loss import (
    SimpleJoiner, node_occupation, pruned_rnnt_losses, pruned_transducer_loss, pruning_bounds, simple_lattice,
)
from ssm_fairseq.asr.transducer.rnnt_loss import rnnt_loss
from toy_transducer import BLANK, ToyTransducer, full_loss, train, utterances

TWO_LABEL_WORDS = [(4, 5), (6, 7), (8, 4), (5, 8)]


def random_batch(B=3, T=7, U=4, V=6, seed=0):
    torch.manual_seed(seed)
    joiner, simple = Joiner(5, 4, 8, V).double(), SimpleJoiner(5, 4, V).double()
    encoder_out = torch.randn(B, T, 5, dtype=torch.float64, requires_grad=True)
    predictor_out = torch.randn(B, U + 1, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(1, V, (B, U))
    logit_lengths, target_lengths = torch.tensor([T, T - 2, 3])[:B], torch.tensor([U, U - 2, 0])[:B]
    return joiner, simple, encoder_out, predictor_out, targets, logit_lengths, target_lengths


@pytest.mark.parametrize("extra", [0, 3])
def test_without_pruning_equals_the_full_loss_and_gradients(extra):
    joiner, simple, enc, pred, targets, T_lengths, U_lengths = random_batch()
    _, pruned = pruned_rnnt_losses(joiner, simple, enc, pred, targets, T_lengths, U_lengths, BLANK,
                                   prune_range=targets.shape[1] + 1 + extra)
    full = rnnt_loss(joiner(enc, pred), targets, T_lengths, U_lengths, blank=BLANK, backend="pytorch")
    assert torch.allclose(pruned, full, atol=1e-10, rtol=0)
    inputs = [enc, pred, *joiner.parameters()]
    for g_pruned, g_full in zip(torch.autograd.grad(pruned.sum(), inputs), torch.autograd.grad(full.sum(), inputs)):
        assert torch.allclose(g_pruned, g_full, atol=1e-8, rtol=0)


def test_simple_loss_is_the_rnnt_loss_of_the_trivial_joiner():
    joiner, simple, enc, pred, targets, T_lengths, U_lengths = random_batch()
    simple_loss, _ = pruned_rnnt_losses(joiner, simple, enc, pred, targets, T_lengths, U_lengths, BLANK)
    am, lm = simple(enc, pred)
    slow = rnnt_loss(am[:, :, None] + lm[:, None], targets, T_lengths, U_lengths, blank=BLANK, backend="pytorch")
    assert torch.allclose(simple_loss, slow, atol=1e-10, rtol=0)
    inputs = [enc, pred, *simple.parameters()]
    for a, b in zip(torch.autograd.grad(simple_loss.sum(), inputs), torch.autograd.grad(slow.sum(), inputs)):
        assert torch.allclose(a, b, atol=1e-8, rtol=0)


def test_simple_lattice_stays_finite_with_large_logits():
    am, lm = torch.randn(2, 5, 7) * 200, torch.randn(2, 4, 7) * 200
    blank_lp, label_lp = simple_lattice(am, lm, torch.randint(1, 7, (2, 3)), BLANK)
    assert torch.isfinite(blank_lp).all() and torch.isfinite(label_lp).all() and (blank_lp <= 1e-4).all()


def check_bounds(starts, logit_lengths, target_lengths, S, U1):
    """Monotone, connected, inside the lattice, from node (0, 0) to the last frame's node U."""
    assert (starts[:, 0] == 0).all()
    steps = starts[:, 1:] - starts[:, :-1]
    assert (steps >= 0).all() and (steps <= S - 1).all()
    assert (starts >= 0).all() and (starts + S <= U1).all()
    last = starts.gather(1, (logit_lengths - 1)[:, None]).squeeze(1)
    assert (last + S - 1 >= target_lengths).all()


@pytest.mark.parametrize("S", [2, 3, 4])
def test_bounds_of_random_occupations(S):
    torch.manual_seed(S)
    B, T, U = 4, 9, 8
    logit_lengths, target_lengths = torch.tensor([9, 7, 5, 9]), torch.tensor([8, 5, 3, 0])
    starts = pruning_bounds(torch.rand(B, T, U + 1), logit_lengths, target_lengths, S)
    check_bounds(starts, logit_lengths, target_lengths, S, U + 1)


@pytest.fixture(scope="module")
def trained_pruned():
    """A toy model trained with the pruned loss (S = 3, words of two labels per frame) and its simple joiner."""
    model = ToyTransducer(words=len(TWO_LABEL_WORDS))
    model.simple = SimpleJoiner(16, 24, model.joiner.output.out_features)

    def loss_of(features, lengths, targets, target_lengths):
        simple, pruned = pruned_rnnt_losses(model.joiner, model.simple, model.encoder(features, lengths)["encoder_out"],
                                            model.predict(targets), targets, lengths, target_lengths, BLANK, 3)
        return (0.5 * simple + pruned).mean()

    losses = train(model, loss_of, steps=200, words=TWO_LABEL_WORDS)
    return model.eval(), losses


def test_training_with_the_pruned_loss_reduces_the_full_loss_as_the_full_loss_does(trained_pruned):
    model, _ = trained_pruned
    reference = ToyTransducer(words=len(TWO_LABEL_WORDS))
    train(reference, lambda *batch: full_loss(reference, *batch).mean(), steps=200, words=TWO_LABEL_WORDS)
    batch = utterances(32, torch.Generator().manual_seed(5), TWO_LABEL_WORDS)
    untrained = ToyTransducer(words=len(TWO_LABEL_WORDS))
    with torch.no_grad():
        before = full_loss(untrained, *batch).mean().item()
        after_pruned, after_full = full_loss(model, *batch).mean().item(), full_loss(reference, *batch).mean().item()
    assert after_pruned < 0.05 * before and after_full < 0.05 * before
    assert after_pruned < after_full + 0.1


def test_bounds_contain_the_best_alignment_of_a_trained_model(trained_pruned):
    model, _ = trained_pruned
    features, lengths, targets, target_lengths = utterances(16, torch.Generator().manual_seed(3), TWO_LABEL_WORDS)
    with torch.no_grad():
        encoder_out = model.encoder(features, lengths)["encoder_out"]
        predictor_out = model.predict(targets)
        blank_lp, label_lp = simple_lattice(*model.simple(encoder_out, predictor_out), targets, BLANK)
        occupation = node_occupation(blank_lp, label_lp, lengths, target_lengths)
        starts = pruning_bounds(occupation, lengths, target_lengths, 3)
        check_bounds(starts, lengths, target_lengths, 3, targets.shape[1] + 1)
        lattice = model.lattice(features, lengths, targets)
    for b in range(len(lengths)):
        for t, u in viterbi_nodes(lattice[b], targets[b], int(lengths[b]), int(target_lengths[b])):
            assert starts[b, t] <= u < starts[b, t] + 3


def viterbi_nodes(log_probs, targets, T, U):
    """The lattice nodes ``(t, u)`` visited by the most probable alignment (``log_probs``: ``T x (U+1) x V``)."""
    best = torch.full((T, U + 1), -torch.inf, dtype=torch.float64)
    for t in range(T):
        for u in range(U + 1):
            if t == 0 and u == 0:
                best[t, u] = 0.0
                continue
            via_blank = best[t - 1, u] + log_probs[t - 1, u, BLANK] if t > 0 else -torch.inf
            via_label = best[t, u - 1] + log_probs[t, u - 1, targets[u - 1]] if u > 0 else -torch.inf
            best[t, u] = max(via_blank, via_label)
    nodes, t, u = [(T - 1, U)], T - 1, U
    while (t, u) != (0, 0):
        via_label = best[t, u - 1] + log_probs[t, u - 1, targets[u - 1]] if u > 0 else -torch.inf
        t, u = (t, u - 1) if u > 0 and torch.isclose(torch.as_tensor(best[t, u]), torch.as_tensor(via_label)) \
            else (t - 1, u)
        nodes.append((t, u))
    return nodes


def test_unreachable_utterances_are_dropped_not_nan():
    joiner, simple, enc, pred, targets, T_lengths, U_lengths = random_batch(B=2, T=3, U=6)
    U_lengths = torch.tensor([6, 2])  # 6 labels in 3 frames cannot fit windows of 2 positions (1 label a frame)
    losses, kept = pruned_transducer_loss(joiner, simple, enc, pred, targets, torch.tensor([3, 3]), U_lengths, BLANK,
                                          prune_range=2)
    assert kept.tolist() == [False, True] and torch.isfinite(losses).all() and (losses[0] == 0).all()
    losses.sum().backward()
    assert torch.isfinite(enc.grad).all() and (enc.grad[0] == 0).all()


def test_prune_range_below_two_is_rejected():
    joiner, simple, enc, pred, targets, T_lengths, U_lengths = random_batch()
    with pytest.raises(ValueError, match="prune_range"):
        pruned_rnnt_losses(joiner, simple, enc, pred, targets, T_lengths, U_lengths, BLANK, prune_range=1)
