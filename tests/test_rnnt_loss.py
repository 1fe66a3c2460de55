import math

import pytest
import torch

from ssm_fairseq.asr.transducer import rnnt_loss as rnnt
from ssm_fairseq.asr.transducer.joiner import Joiner
from ssm_fairseq.asr.transducer.rnnt_loss import rnnt_loss, torchaudio_rnnt_available, transducer_loss

needs_torchaudio = pytest.mark.skipif(not torchaudio_rnnt_available(), reason="torchaudio rnnt_loss does not import")
BACKENDS = ["pytorch", pytest.param("torchaudio", marks=needs_torchaudio)]


def brute_force_nll(logits: torch.Tensor, targets: list[int], blank: int) -> float:
    """-log P(y|x) by enumerating every path through one utterance's ``T x (U+1) x V`` lattice."""
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    T, U = logits.size(0), len(targets)

    def paths(t: int, u: int):
        """Log-probabilities of every path from node (t, u) to the final blank."""
        if t == T - 1 and u == U:
            yield log_probs[t, u, blank].item()
            return
        if t < T - 1:
            for rest in paths(t + 1, u):
                yield log_probs[t, u, blank].item() + rest
        if u < U:
            for rest in paths(t, u + 1):
                yield log_probs[t, u, targets[u]].item() + rest

    scores = list(paths(0, 0))
    assert len(scores) == math.comb(T - 1 + U, U)
    top = max(scores)
    return -(top + math.log(sum(math.exp(s - top) for s in scores)))


def random_targets(B: int, U: int, V: int, blank: int) -> torch.Tensor:
    """Labels in ``[0, V)`` other than ``blank``."""
    labels = torch.randint(0, V - 1, (B, U))
    return labels + (labels >= blank).long()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("V", [3, 4])
def test_single_utterances_match_brute_force(backend, V):
    dtype, tol = (torch.float64, 1e-10) if backend == "pytorch" else (torch.float32, 1e-5)
    for T in range(1, 5):
        for U in range(0, 4):
            for blank in (0, V - 1):
                logits = 2 * torch.randn(1, T, U + 1, V, dtype=torch.float64)
                targets = random_targets(1, U, V, blank)
                loss = rnnt_loss(logits.to(dtype), targets, torch.tensor([T]), torch.tensor([U]), blank, backend)
                expected = brute_force_nll(logits[0], targets[0].tolist(), blank)
                assert loss.dtype == dtype
                assert loss.item() == pytest.approx(expected, abs=tol, rel=tol), (T, U, blank)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_batch_matches_brute_force(backend):
    dtype, tol = (torch.float64, 1e-10) if backend == "pytorch" else (torch.float32, 1e-5)
    logit_lengths, target_lengths, blank, V = torch.tensor([4, 2, 1, 3]), torch.tensor([3, 0, 2, 1]), 1, 4
    logits = 2 * torch.randn(4, 4, 4, V, dtype=torch.float64)
    targets = random_targets(4, 3, V, blank)
    targets[1] = blank  # padding may hold any valid index
    losses = rnnt_loss(logits.to(dtype), targets, logit_lengths, target_lengths, blank, backend)
    for b, (T, U) in enumerate(zip(logit_lengths.tolist(), target_lengths.tolist())):
        expected = brute_force_nll(logits[b, :T, :U + 1], targets[b, :U].tolist(), blank)
        assert losses[b].item() == pytest.approx(expected, abs=tol, rel=tol), b


def padded_lattice(requires_grad: bool = True):
    B, T, U, V = 3, 12, 5, 7
    logits = torch.randn(B, T, U + 1, V, requires_grad=requires_grad)
    return logits, random_targets(B, U, V, 0), torch.tensor([12, 7, 9]), torch.tensor([5, 2, 0])


def loss_and_grad(backend, logits, *args):
    logits = logits.detach().requires_grad_()
    loss = rnnt_loss(logits, *args, blank=0, backend=backend)
    (grad,) = torch.autograd.grad((loss * torch.tensor([1.0, 2.0, 0.5])).sum(), logits)
    return loss, grad


@needs_torchaudio
def test_backends_agree_in_loss_and_gradient():
    logits, *args = padded_lattice()
    loss_ta, grad_ta = loss_and_grad("torchaudio", logits, *args)
    loss_pt, grad_pt = loss_and_grad("pytorch", logits, *args)
    assert loss_pt.dtype == torch.float32
    torch.testing.assert_close(loss_pt, loss_ta, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(grad_pt, grad_ta, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_positions_get_zero_gradient(backend):
    logits, targets, logit_lengths, target_lengths = padded_lattice()
    _, grad = loss_and_grad(backend, logits, targets, logit_lengths, target_lengths)
    for b, (T, U) in enumerate(zip(logit_lengths.tolist(), target_lengths.tolist())):
        assert grad[b, T:].abs().sum() == 0
        assert grad[b, :, U + 1:].abs().sum() == 0
        assert grad[b, :T, :U + 1].abs().sum() > 0


def test_pytorch_backend_gradcheck():
    logits = torch.randn(2, 3, 3, 4, dtype=torch.float64, requires_grad=True)
    targets, logit_lengths, target_lengths = torch.tensor([[1, 3], [2, 0]]), torch.tensor([3, 2]), torch.tensor([2, 1])
    assert torch.autograd.gradcheck(
        lambda x: rnnt_loss(x, targets, logit_lengths, target_lengths, blank=2, backend="pytorch"), (logits,))


def test_pytorch_backend_float16_logits():
    logits, *args = padded_lattice()
    half = logits.detach().half()
    loss_half, grad_half = loss_and_grad("pytorch", half, *args)
    loss_ref, grad_ref = loss_and_grad("pytorch", half.double(), *args)
    assert loss_half.dtype == torch.float32 and grad_half.dtype == torch.float16
    torch.testing.assert_close(loss_half.double(), loss_ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(grad_half.double(), grad_ref, atol=1e-3, rtol=1e-2)


def test_pytorch_backend_minus_inf_logits():
    """A label made impossible at some nodes: the loss is that of the other paths, gradients stay finite."""
    logits = torch.randn(1, 4, 3, 4, dtype=torch.float64)
    targets = torch.tensor([[2, 3]])
    logits[0, 1:3, 0, 2] = -math.inf
    logits[0, 0, 1, 0] = -math.inf  # blank
    logits.requires_grad_()
    loss = rnnt_loss(logits, targets, torch.tensor([4]), torch.tensor([2]), blank=0, backend="pytorch")
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    assert loss.item() == pytest.approx(brute_force_nll(logits[0].detach(), [2, 3], 0), abs=1e-10)
    assert torch.isfinite(grad).all()


def test_auto_falls_back_to_pytorch(monkeypatch):
    logits, *args = padded_lattice()
    expected = rnnt_loss(logits, *args, blank=0, backend="pytorch")
    monkeypatch.setattr(rnnt, "torchaudio_rnnt_available", lambda: False)
    loss = rnnt_loss(logits, *args, blank=0)
    assert "Rnnt" not in type(loss.grad_fn).__name__
    torch.testing.assert_close(loss, expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match="'torchaudio' requested but"):
        rnnt_loss(logits, *args, blank=0, backend="torchaudio")


def test_auto_uses_pytorch_for_float64():
    logits, *args = padded_lattice()
    loss = rnnt_loss(logits.double(), *args, blank=0)
    assert loss.dtype == torch.float64 and "Rnnt" not in type(loss.grad_fn).__name__


@pytest.mark.parametrize("change, message", [
    (lambda a: dict(a, logits=a["logits"][0]), "B x T x \\(U\\+1\\) x V"),
    (lambda a: dict(a, targets=a["targets"][:, :4]), "B x U = 3 x 5"),
    (lambda a: dict(a, targets=a["targets"].float()), "integer"),
    (lambda a: dict(a, logit_lengths=a["logit_lengths"][:2]), "logit_lengths must be an integer tensor of shape"),
    (lambda a: dict(a, logit_lengths=torch.tensor([13, 7, 9])), "logit_lengths must lie in \\[1, T = 12\\]"),
    (lambda a: dict(a, logit_lengths=torch.tensor([12, 0, 9])), "logit_lengths must lie in \\[1, T = 12\\]"),
    (lambda a: dict(a, target_lengths=torch.tensor([6, 2, 0])), "target_lengths must lie in \\[0, U = 5\\]"),
    (lambda a: dict(a, targets=a["targets"] + 7), "targets must lie in \\[0, V = 7\\)"),
    (lambda a: dict(a, blank=7), "blank index 7 is out of range for a vocabulary of 7"),
    (lambda a: dict(a, backend="k2"), "backend must be one of"),
    (lambda a: dict(a, logits=a["logits"].double(), backend="torchaudio"), "float32 or float16"),
])
def test_bad_input_raises(change, message, monkeypatch):
    monkeypatch.setattr(rnnt, "torchaudio_rnnt_available", lambda: True)
    logits, targets, logit_lengths, target_lengths = padded_lattice(requires_grad=False)
    args = dict(logits=logits, targets=targets, logit_lengths=logit_lengths, target_lengths=target_lengths, blank=0,
                backend="pytorch")
    with pytest.raises(ValueError, match=message):
        rnnt_loss(**change(args))


def joint_case(B: int = 4):
    T, U, V = 9, 4, 7
    joiner = Joiner(6, 5, 8, V)
    encoder_out = torch.randn(B, T, 6, requires_grad=True)
    predictor_out = torch.randn(B, U + 1, 5, requires_grad=True)
    targets = random_targets(B, U, V, 0)
    return joiner, encoder_out, predictor_out, targets, torch.tensor([9, 4, 7, 2])[:B], torch.tensor([3, 4, 0, 2])[:B]


def joint_grads(joiner, encoder_out, predictor_out, *args, **kwargs):
    """Losses, kept and the gradients of ``losses.sum()`` wrt encoder_out, predictor_out, joiner parameters."""
    losses, kept = transducer_loss(joiner, encoder_out, predictor_out, *args, blank=0, **kwargs)
    grads = torch.autograd.grad(losses.sum(), [encoder_out, predictor_out, *joiner.parameters()])
    return losses, kept, grads


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sub_batch_size", [1, 2])
def test_sub_batches_match_whole_batch(backend, sub_batch_size):
    case = joint_case()
    losses, kept, grads = joint_grads(*case, backend=backend, sub_batch_size=0)
    sub_losses, sub_kept, sub_grads = joint_grads(*case, backend=backend, sub_batch_size=sub_batch_size)
    assert kept.all() and sub_kept.all()
    torch.testing.assert_close(sub_losses, losses, atol=1e-5, rtol=1e-5)
    for sub_grad, grad in zip(sub_grads, grads):
        torch.testing.assert_close(sub_grad, grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sub_batch_size", [0, 2])
def test_empty_utterance_is_dropped(sub_batch_size):
    joiner, encoder_out, predictor_out, targets, encoder_lengths, target_lengths = joint_case()
    encoder_lengths[1] = 0
    losses, kept, _ = joint_grads(joiner, encoder_out, predictor_out, targets, encoder_lengths, target_lengths,
                                  sub_batch_size=sub_batch_size)
    assert kept.tolist() == [True, False, True, True] and losses[1] == 0
    others = [0, 2, 3]
    expected, _ = transducer_loss(joiner, encoder_out[others], predictor_out[others], targets[others],
                                  encoder_lengths[others], target_lengths[others], blank=0)
    torch.testing.assert_close(losses[others], expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sub_batch_size", [0, 2])
def test_nan_utterance_is_dropped(backend, sub_batch_size):
    joiner, encoder_out, predictor_out, targets, encoder_lengths, target_lengths = joint_case()
    poisoned = encoder_out.detach().clone()
    poisoned[2] = math.nan
    poisoned.requires_grad_()
    losses, kept, grads = joint_grads(joiner, poisoned, predictor_out, targets, encoder_lengths, target_lengths,
                                      backend=backend, sub_batch_size=sub_batch_size)
    assert kept.tolist() == [True, True, False, True] and losses[2] == 0
    assert all(torch.isfinite(g).all() for g in grads)
    others = [0, 1, 3]
    alone = [x.detach()[others].requires_grad_() for x in (encoder_out, predictor_out)]
    expected, _, expected_grads = joint_grads(joiner, *alone, targets[others], encoder_lengths[others],
                                              target_lengths[others], backend=backend)
    torch.testing.assert_close(losses[others], expected, atol=1e-5, rtol=1e-5)
    for grad, expected_grad in zip(grads[:2], expected_grads[:2]):
        torch.testing.assert_close(grad[others], expected_grad, atol=1e-5, rtol=1e-5)
        assert grad[2].abs().sum() == 0
    for grad, expected_grad in zip(grads[2:], expected_grads[2:]):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sub_batch_size", [0, 1, 3])
def test_transducer_loss_without_grad(sub_batch_size):
    case = joint_case()
    expected, _ = transducer_loss(*case, blank=0)
    with torch.no_grad():
        losses, kept = transducer_loss(*case, blank=0, sub_batch_size=sub_batch_size)
    assert kept.all() and not losses.requires_grad
    torch.testing.assert_close(losses, expected.detach(), atol=1e-5, rtol=1e-5)


def test_transducer_loss_bad_input():
    joiner, encoder_out, predictor_out, targets, encoder_lengths, target_lengths = joint_case()
    with pytest.raises(ValueError, match="must agree"):
        transducer_loss(joiner, encoder_out, predictor_out[:, :3], targets, encoder_lengths, target_lengths, 0)
    with pytest.raises(ValueError, match="sub_batch_size must be >= 0"):
        transducer_loss(joiner, encoder_out, predictor_out, targets, encoder_lengths, target_lengths, 0,
                        sub_batch_size=-1)
