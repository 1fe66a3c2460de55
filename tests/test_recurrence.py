import pytest
import torch

from kernel_cases import KERNEL_CASES, make_kernel
from ssm_fairseq.ssm import fft_conv
from ssm_fairseq.ssm.discretization import bilinear_dense, bilinear_low_rank
from ssm_fairseq.ssm.recurrence import (
    ConjugatePairRecurrence,
    DenseRecurrence,
    DiagonalRecurrence,
    LowRankRecurrence,
    Recurrence,
)

TOLERANCE = {torch.float64: 1e-8, torch.float32: 1e-4}
# Kernels whose definition depends on the length L they are computed for: S4's kernel is built for l_max (its C is
# folded with (I - dA^l_max), and a longer convolution is refused), DSS-softmax normalises over the L positions.
# A step past L therefore has no "convolution of the longer sequence" to equal.
LENGTH_DEPENDENT = {"s4", "s4_frozen", "dss_softmax", "dss_softmax_random"}


def convolution_output(kernel, u):
    K, D = kernel(u.shape[-1])
    return fft_conv(u, K, D)


def kernel_input_and_output(name, dtype, batch, L):
    """A small kernel, a random ``batch x H x L`` input, its convolution output and the kernel's recurrence."""
    kernel = make_kernel(name, L, dtype)
    u = torch.randn(batch, kernel.channels, L, dtype=dtype)
    with torch.no_grad():
        return kernel, u, convolution_output(kernel, u), kernel.recurrence(L)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_step_mode_equals_convolution(name, dtype):
    L = 48
    kernel, u, expected, rec = kernel_input_and_output(name, dtype, 2, L)
    with torch.no_grad():
        state = rec.initial_state(2)
        steps = []
        for k in range(L):
            y, state = rec.step(u[..., k], state)
            steps.append(y)
    scale = expected.abs().max()
    tol = TOLERANCE[dtype]
    assert (torch.stack(steps, -1) - expected).abs().max() <= tol * scale


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_chunks_continue_from_state(name, dtype):
    kernel, u, expected, rec = kernel_input_and_output(name, dtype, 3, 160)
    with torch.no_grad():
        state = rec.initial_state(3)
        pieces = []
        # short pieces multiply by the Toeplitz matrix, the 100-step one goes through the FFT; 25 twice: the kept
        # matrices of a length are reused
        for piece in u.split([25, 1, 100, 25, 9], dim=-1):
            y, state = rec.chunk(piece, state)
            pieces.append(y)
        # a step after the chunks equals the convolution of the longer sequence
        extra = torch.randn(3, kernel.channels, dtype=dtype)
        y_next, _ = rec.step(extra, state)
    tol = TOLERANCE[dtype] * expected.abs().max()
    assert (torch.cat(pieces, -1) - expected).abs().max() <= tol
    if name not in LENGTH_DEPENDENT:
        longer = convolution_output(kernel, torch.cat([u, extra.unsqueeze(-1)], -1))[..., -1]
        assert (y_next - longer).abs().max() <= tol


def test_matrices_kept_without_autograd_do_not_cut_gradients():
    """A chunk under autograd after one without (which keeps its matrices) gets the gradients of a recurrence that
    never kept any."""
    kernel = make_kernel("mssm", 8).double()
    u = torch.randn(2, kernel.channels, 12, dtype=torch.float64)
    gradients = []
    for warm in (False, True):
        rec = kernel.recurrence(1)
        if warm:
            with torch.no_grad():
                rec.chunk(u, rec.initial_state(2))
        kernel.zero_grad()
        rec.chunk(u, rec.initial_state(2))[0].square().sum().backward()
        gradients.append(kernel.C.grad.clone())
    assert gradients[0].abs().sum() > 0 and torch.allclose(gradients[0], gradients[1])


def test_a_zero_eigenvalue_streams_as_it_convolves():
    """A real base of 0 (bilinear 1 + dt mu / 2 rounding to 0): 0^0 = 1 in chunks too, as in convolution mode."""
    dA = torch.tensor([[0.0, 0.5, -0.7]], dtype=torch.float64)
    ones = dict(dtype=torch.float64)
    rec = DiagonalRecurrence(dA, torch.ones(1, 3, **ones), torch.ones(1, 1, 3, **ones), torch.zeros(1, 1, **ones))
    u = torch.randn(1, 1, 5, dtype=torch.float64)
    y_chunk, _ = rec.chunk(u, rec.initial_state(1))
    y_steps, _ = Recurrence.chunk(rec, u, rec.initial_state(1))  # the step-by-step definition
    assert torch.isfinite(y_chunk).all() and torch.allclose(y_chunk, y_steps, atol=1e-12)


def test_every_length_dependent_kernel_is_a_case():
    """The exclusion above names existing cases only, and leaves most kernels (S4D, DSS-exp, MSSM) checked."""
    assert LENGTH_DEPENDENT <= set(KERNEL_CASES)
    assert {"s4d_legs", "s4d_lin", "s4d_random", "dss_exp", "mssm"} <= set(KERNEL_CASES) - LENGTH_DEPENDENT


def test_bad_step_input():
    rec = make_kernel("mssm", 8).recurrence(8)
    state = rec.initial_state(2)
    with pytest.raises(ValueError, match=r"step input must have shape \(batch, 4\), got \(2, 3\)"):
        rec.step(torch.randn(2, 3), state)
    with pytest.raises(ValueError, match=r"state of shape \(2, 4, 6\) does not match input \(5, 4\)"):
        rec.step(torch.randn(5, 4), state)


def random_low_rank_system(H: int = 3, N: int = 6):
    """A random ``A = diag(Lambda) - P P^*`` (stable diagonal), ``B``, ``C``, ``D`` and ``dt``, in complex128."""
    Lambda = torch.complex(-torch.rand(N, dtype=torch.float64) - 0.1, torch.randn(N, dtype=torch.float64))
    P, B = torch.randn(N, dtype=torch.complex128), torch.randn(H, N, dtype=torch.complex128)
    C, D = torch.randn(2, H, N, dtype=torch.complex128), torch.randn(2, H, dtype=torch.float64)
    dt = torch.rand(H, dtype=torch.float64) * 0.5 + 0.01
    return Lambda, P, B, C, D, dt


def test_bilinear_low_rank_equals_the_dense_bilinear_rule():
    """``diag(g) + U^T V`` and ``dB`` equal the textbook ``(I - dt A / 2)^-1 (I + dt A / 2)`` and
    ``(I - dt A / 2)^-1 dt B`` of the dense matrix ``A = diag(Lambda) - P P^*``."""
    Lambda, P, B, _, _, dt = random_low_rank_system()
    A = (torch.diag(Lambda) - P.unsqueeze(-1) * P.conj()).expand(len(dt), -1, -1)
    dA, dB = bilinear_dense(A, B, dt)
    g, U, V, dB_low_rank = bilinear_low_rank(Lambda, P, B, dt)
    assert U.shape == V.shape == (2,) + tuple(B.shape)
    torch.testing.assert_close(torch.diag_embed(g) + torch.einsum("khn,khm->hnm", U, V), dA, atol=1e-12, rtol=0)
    torch.testing.assert_close(dB_low_rank, dB, atol=1e-12, rtol=0)


def test_low_rank_steps_equal_dense_steps():
    """``LowRankRecurrence`` steps like ``DenseRecurrence`` built from the same system's dense matrices."""
    Lambda, P, B, C, D, dt = random_low_rank_system()
    A = (torch.diag(Lambda) - P.unsqueeze(-1) * P.conj()).expand(len(dt), -1, -1)
    dense = DenseRecurrence(*bilinear_dense(A, B, dt), C, D)
    low_rank = LowRankRecurrence(*bilinear_low_rank(Lambda, P, B, dt), C, D)
    u = torch.randn(2, len(dt), 20, dtype=torch.float64)
    y_dense, state_dense = dense.chunk(u, dense.initial_state(2))
    y_low_rank, state_low_rank = low_rank.chunk(u, low_rank.initial_state(2))
    torch.testing.assert_close(y_low_rank, y_dense, atol=1e-10, rtol=0)
    torch.testing.assert_close(state_low_rank, state_dense, atol=1e-10, rtol=0)


def test_conjugate_pair_steps_equal_the_full_state_steps():
    """On a system whose states come in conjugate pairs, driven by real inputs, stepping one state of each pair gives
    the full state's outputs, and its state is the full state's first half."""
    Lambda, P, B, C, D, dt = random_low_rank_system(N=4)
    pairs = lambda x: torch.cat([x, x.conj()], -1)  # noqa: E731
    system = (*bilinear_low_rank(pairs(Lambda), pairs(P), pairs(B), dt), pairs(C), D)
    full, half = LowRankRecurrence(*system), ConjugatePairRecurrence(*system)
    u = torch.randn(2, len(dt), 20, dtype=torch.float64)
    y_full, state_full = full.chunk(u, full.initial_state(2))
    y_half, state_half = half.chunk(u, half.initial_state(2))
    assert state_half.shape == (2, len(dt), 4)
    torch.testing.assert_close(y_half, y_full, atol=1e-10, rtol=0)
    torch.testing.assert_close(state_half, state_full[..., :4], atol=1e-10, rtol=0)
