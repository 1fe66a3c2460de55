import pytest
import torch

from kernel_cases import KERNEL_CASES, make_kernel
from ssm_fairseq.ssm import fft_conv
from ssm_fairseq.ssm.recurrence import DiagonalRecurrence, Recurrence

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
