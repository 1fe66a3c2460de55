"""The chunked convolution of a real diagonal SSM against the FFT convolution of its Vandermonde kernel and
against the state recurrence run position by position."""
import pytest
import torch

from ssm_fairseq.ssm import fft_conv
from ssm_fairseq.ssm.chunked_conv import (DiagonalSystem, chunk_length, chunk_matrices, chunked_diagonal_conv,
                                          chunk_convolution, diagonal_powers)
from ssm_fairseq.ssm.structured_products import real_vandermonde


def _system(H=5, N=4, C=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    dA = torch.rand(H, N, generator=g, dtype=dtype) * 2 - 1  # both signs, |dA| < 1
    dA[0, 0] = 0.0  # a base that rounds to zero: 0^0 = 1, every later power ~0
    dB, dC, D = (torch.randn(*shape, generator=g, dtype=dtype) for shape in [(H, N), (C, H, N), (C, H)])
    return dA, dB, dC, D


def _recurrence(u, dA, dB, dC, D):
    """``x_k = dA x_(k-1) + dB u_k``, ``y_k = dC x_k + D u_k``, one position at a time: ``B x C x H x L``."""
    x = torch.zeros(u.shape[0], *dA.shape, dtype=u.dtype)
    out = []
    for k in range(u.shape[-1]):
        x = dA * x + dB * u[:, :, k, None]
        out.append(torch.einsum("chn,bhn->bch", dC, x) + D * u[:, None, :, k])
    return torch.stack(out, -1)


@pytest.mark.parametrize("L, chunk", [(1, None), (7, 1), (37, 4), (37, 8), (64, 16), (40, 64)])
def test_equals_the_recurrence_and_the_fft_convolution(L, chunk):
    dA, dB, dC, D = _system()
    u = torch.randn(3, 5, L, dtype=torch.float64)
    y = chunked_diagonal_conv(u, dA, dB, dC, D, chunk=chunk)
    torch.testing.assert_close(y, _recurrence(u, dA, dB, dC, D))
    torch.testing.assert_close(y, fft_conv(u, real_vandermonde(dC * dB, dA, L), D))


def test_reverse_is_the_reversed_input_convolved_and_reversed():
    dA, dB, dC, D = _system()
    u = torch.randn(2, 5, 29, dtype=torch.float64)
    y = chunked_diagonal_conv(u, dA, dB, dC, D, reverse=True, chunk=8)
    torch.testing.assert_close(y, chunked_diagonal_conv(u.flip(-1), dA, dB, dC, D, chunk=8).flip(-1))
    torch.testing.assert_close(y, fft_conv(u, real_vandermonde(dC * dB, dA, 29), D, reverse=True))


@pytest.mark.parametrize("reverse", [False, True])
def test_padding_equals_each_sequence_alone(reverse):
    dA, dB, dC, D = _system()
    u = torch.randn(2, 5, 30, dtype=torch.float64)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[1, 17:] = True
    u_padded = u.masked_fill(mask[:, None, :], 1e3)  # garbage in the padding must not reach real positions
    y = chunked_diagonal_conv(u_padded, dA, dB, dC, D, mask, reverse, chunk=8)
    alone = chunked_diagonal_conv(u[1:, :, :17], dA, dB, dC, D, reverse=reverse, chunk=8)
    torch.testing.assert_close(y[1, ..., :17], alone[0])
    assert y[1, ..., 17:].abs().max() == 0


@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_equal_the_fft_convolutions(reverse):
    dA, dB, dC, D = _system()
    u = torch.randn(2, 5, 23, dtype=torch.float64)
    grad = torch.randn(2, 2, 5, 23, dtype=torch.float64)
    results = []
    for chunked in (True, False):
        leaves = [t.clone().requires_grad_() for t in (u, dA, dB, dC, D)]
        uu, a, b, c, d = leaves
        y = (chunked_diagonal_conv(uu, a, b, c, d, reverse=reverse, chunk=4) if chunked
             else fft_conv(uu, real_vandermonde(c * b, a, 23), d, reverse=reverse))
        results.append(torch.autograd.grad(y, leaves, grad))
    for chunked_grad, fft_grad in zip(*results):
        torch.testing.assert_close(chunked_grad, fft_grad)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck(reverse):
    dA, dB, dC, D = _system(H=2, N=3, C=2)
    u = torch.randn(2, 2, 9, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (u, dA * 0.9 + 0.05, dB, dC, D)]
    assert torch.autograd.gradcheck(lambda *a: chunked_diagonal_conv(*a, reverse=reverse, chunk=4), leaves)


def test_low_precision_input_is_convolved_in_float32():
    dA, dB, dC, D = (t.float() for t in _system())
    u = torch.randn(1, 5, 50)
    y = chunked_diagonal_conv(u.to(torch.bfloat16), dA, dB, dC, D)
    assert y.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = chunked_diagonal_conv(u, dA, dB, dC, D)
    assert z.dtype == torch.float32
    torch.testing.assert_close(z, chunked_diagonal_conv(u, dA, dB, dC, D))


def test_powers_keep_sign_and_stay_normal():
    dA = torch.tensor([[0.5, -0.5, 0.0, -1.0]])
    p = diagonal_powers(dA, 200)
    torch.testing.assert_close(p[0, 1, :4], torch.tensor([1.0, -0.5, 0.25, -0.125]))
    torch.testing.assert_close(p[0, 3, :3], torch.tensor([1.0, -1.0, 1.0]))
    assert p[0, 2, :2].tolist() == [1.0, 0.0]  # 0^0 = 1, 0^1 = 0 exactly
    assert (p[..., 2:].abs() >= torch.finfo(torch.float32).tiny ** (1 / 3) * 0.99).all()  # no subnormal power


def test_chunk_lengths():
    assert [chunk_length(L) for L in (1, 250, 1024, 4096, 16384, 10 ** 6)] == [8, 8, 16, 32, 64, 64]
    # batches: a fairseq-train batch of 10,000 positions (26 x 375, 200 x 50) at 32, 2,000 positions at 16
    batches = ((375, 26), (50, 200), (250, 8), (1000, 2), (4096, 64))
    assert [chunk_length(L, B) for L, B in batches] == [32, 32, 16, 16, 64]


def test_bad_system():
    dA, dB, dC, D = _system()
    with pytest.raises(ValueError, match="dC of shape"):
        chunked_diagonal_conv(torch.randn(1, 5, 8, dtype=torch.float64), dA, dB, dC[:, :4], D)
    with pytest.raises(ValueError, match="u must have shape"):
        chunked_diagonal_conv(torch.randn(1, 4, 8, dtype=torch.float64), dA, dB, dC, D)


@pytest.mark.parametrize("reverse", [False, True])
def test_channel_last_input_gives_the_same_output(reverse):
    """A ``B x L x H`` tensor transposed (strided rows) and a contiguous one of the same values."""
    dA, dB, dC, D = _system()
    u = torch.randn(3, 5, 37, dtype=torch.float64)
    channel_last = u.transpose(1, 2).contiguous().transpose(1, 2)
    torch.testing.assert_close(chunked_diagonal_conv(channel_last, dA, dB, dC, D, reverse=reverse, chunk=8),
                               chunked_diagonal_conv(u, dA, dB, dC, D, reverse=reverse, chunk=8))


@pytest.mark.parametrize("reverse", [False, True])
def test_training_keeps_no_states_between_chunks_and_gradients_stay_exact(reverse):
    """With autograd the ``H x B x chunks x N`` states are computed again in the backward pass, not kept for it; the
    gradients equal those of the FFT convolution of the same kernel."""
    dA, dB, dC, D = (t.requires_grad_() for t in _system(H=5, N=6))
    u = torch.randn(3, 5, 40, dtype=torch.float64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        y = chunked_diagonal_conv(u, dA, dB, dC, D, reverse=reverse, chunk=8)  # 5 chunks
    assert saved and (5, 3, 5, 6) not in saved and (5, 15, 6) not in saved, saved
    grads = torch.autograd.grad(y.square().sum(), [u, dA, dB, dC, D])
    K = real_vandermonde(dC * dB, dA, 40)
    expected = fft_conv(u, K, D, reverse=reverse)
    for a, b in zip(grads, torch.autograd.grad(expected.square().sum(), [u, dA, dB, dC, D])):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("reverse", [False, True])
def test_channels_first_chunks_equal_the_batch_first_convolution(reverse):
    """Inference's channels-first form (``H x B x L'`` rows of whole chunks in, each output row ``c`` of ``H x B x
    L'`` written in place into the tensor given) equals ``chunked_diagonal_conv`` at every real position, whatever
    the order the rows are asked in; it refuses autograd."""
    dA, dB, dC, D = _system()
    u = torch.randn(3, 5, 30, dtype=torch.float64)
    mask = torch.zeros(3, 30, dtype=torch.bool)
    mask[1, 17:] = True
    rows = torch.zeros(5, 3, 32, dtype=torch.float64)
    rows[..., :30] = u.transpose(0, 1).masked_fill(mask, 0.0)
    matrices = chunk_matrices(DiagonalSystem(dA, dB, dC, D), 8, reverse)
    with torch.no_grad():
        write_row = chunk_convolution(rows, matrices, reverse)
        buffers = [torch.empty_like(rows) for _ in range(2)]
        assert all(write_row(c, buffers[c]) is buffers[c] for c in (1, 0))  # written into the tensor given
        y = torch.stack(buffers)[..., :30].permute(2, 0, 1, 3)
    expected = chunked_diagonal_conv(u, dA, dB, dC, D, mask, reverse, chunk=8)
    torch.testing.assert_close(y.masked_fill(mask[:, None, None], 0.0), expected)
    with pytest.raises(RuntimeError, match="without autograd"):
        chunk_convolution(rows, matrices, reverse)
