import copy

import pytest
import torch
from torch.func import functional_call

from kernel_cases import KERNEL_CASES, make_kernel
from ssm_fairseq.ssm import DSSKernel, MSSMKernel, S4DKernel, S4Kernel


def brute_force_kernel(kernel, L):
    """``K_k = dC dA^k dB`` by explicit matrix powers of the kernel's own dense matrices."""
    m = kernel.dense_matrices(L)
    dA, x, dC = (t.to(torch.complex128) for t in (m.dA, m.dB, m.dC))
    taps = []
    for _ in range(L):
        taps.append(torch.einsum("chn,hn->ch", dC, x))
        x = torch.einsum("hnm,hm->hn", dA, x)
    K = torch.stack(taps, -1)
    assert K.imag.abs().max() < 1e-9 * max(1.0, K.real.abs().max())
    return K.real, m.D


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
@pytest.mark.parametrize("L", [1, 37, 64, 256])
def test_kernel_equals_brute_force(name, L):
    kernel = make_kernel(name, L, torch.float64)
    if isinstance(kernel, DSSKernel):
        kernel.softmax_eps = 0.0  # Proposition 1(b) exactly; the eps correction is tested below
    with torch.no_grad():
        K, D = kernel(L)
    K_ref, D_ref = brute_force_kernel(kernel, L)
    assert K.shape == (kernel.out_channels, kernel.channels, L)
    torch.testing.assert_close(K, K_ref, rtol=1e-6, atol=1e-9 * K_ref.abs().max().item())
    torch.testing.assert_close(D, D_ref)


def test_s4_shorter_kernel_is_prefix_of_l_max_kernel():
    kernel = S4Kernel(2, 8, l_max=100).double()
    with torch.no_grad():
        assert torch.allclose(kernel(37)[0], kernel(100)[0][..., :37])


def test_dss_softmax_eps_correction_is_small():
    kernel = DSSKernel(3, 4, variant="softmax").double()
    with torch.no_grad():
        K_eps = kernel(64)[0]
        kernel.softmax_eps = 0.0
        K_exact = kernel(64)[0]
    assert 0 < (K_eps - K_exact).abs().max() < 1e-5 * K_exact.abs().max()


def test_dss_softmax_with_positive_real_parts():
    kernel = DSSKernel(2, 4, variant="softmax", softmax_eps=0.0).double()
    with torch.no_grad():
        kernel.Lambda_re.copy_(torch.tensor([0.3, 0.05, -0.2, 1.0]))
        kernel.log_dt.fill_(-1.0)
        K, _ = kernel(64)
    torch.testing.assert_close(K, brute_force_kernel(kernel, 64)[0], rtol=1e-6, atol=1e-12)
    kernel = kernel.float()
    with torch.no_grad():
        kernel.Lambda_re.copy_(torch.tensor([2.0, 0.5, 0.0, 5.0]))
        kernel.log_dt.fill_(0.0)
    K, D = kernel(65536)
    (K.square().sum() + D.sum()).backward()
    assert torch.isfinite(K).all()
    assert all(torch.isfinite(p.grad).all() for p in kernel.parameters())


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_gradients_reach_trainable_parameters_only(name):
    kernel = make_kernel(name, 32)
    K, D = kernel(32)
    (K.square().sum() + D.square().sum()).backward()
    for pname, p in kernel.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname
    for bname, b in kernel.named_buffers():
        assert b.grad is None and not b.requires_grad, bname


def test_s4_frozen_parameters_are_buffers():
    frozen = S4Kernel(2, 8, l_max=16, trainable_A=False, trainable_B=False, trainable_dt=False)
    assert {n for n, _ in frozen.named_parameters()} == {"C", "D"}
    assert {n for n, _ in frozen.named_buffers()} == {"log_neg_real", "imag", "P", "B", "log_dt"}
    partly = S4Kernel(2, 8, l_max=16, trainable_A=False)
    assert {n for n, _ in partly.named_parameters()} == {"B", "log_dt", "C", "D"}


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_gradcheck(name):
    L = 12
    kernel = make_kernel(name, L, torch.float64)
    names = [n for n, _ in kernel.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in kernel.parameters())

    def kernel_of(*values):
        K, D = functional_call(kernel, dict(zip(names, values)), (L,))
        return K, D

    assert torch.autograd.gradcheck(kernel_of, params, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_finite_at_65536(name):
    L = 65536
    kernel = make_kernel(name, L)
    K, D = kernel(L)
    assert K.shape[-1] == L and torch.isfinite(K).all()
    (K.abs().mean() + D.sum()).backward()
    for pname, p in kernel.named_parameters():
        assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["s4", "s4d_legs", "dss_softmax", "mssm"])
def test_kernels_compute_in_float32(name, dtype):
    kernel = make_kernel(name, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        K, D = kernel(64)
    assert K.dtype == torch.float32 and D.dtype == torch.float32
    halved = kernel.to(dtype)  # as after fairseq's model.half()
    K_half, _ = halved(64)
    assert K_half.dtype == torch.float32 and torch.isfinite(K_half).all()
    # the same numbers as the float32 computation from the rounded parameters
    K_rounded, _ = copy.deepcopy(halved).float()(64)
    torch.testing.assert_close(K_half, K_rounded)


def test_mssm_parameters_are_tied_per_head():
    kernel = MSSMKernel(channels=12, state_size=32, out_channels=2, heads=3, scale=0.25)
    shapes = {n: tuple(p.shape) for n, p in kernel.named_parameters()}
    assert shapes == {"z_lambda": (3, 32), "p": (3, 32), "B": (3, 32), "C": (2, 12, 32), "D": (2, 12), "z_dt": (12,)}
    m = kernel.dense_matrices(8)
    assert torch.equal(m.A[0], m.A[3]) and not torch.equal(m.A[3], m.A[4])  # 4 channels per head
    assert torch.linalg.eigvalsh(m.A).max() < 0  # Lambda - p p^T is negative definite
    big = MSSMKernel(channels=8, state_size=32, heads=8, scale=0.25)
    assert abs(big.z_lambda.mean().item() - torch.log(torch.tensor(0.25)).item()) < 0.3
    assert abs(big.z_lambda.std().item() - 1.0) < 0.25


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: S4Kernel(2, 7), "even"),
        (lambda: S4DKernel(2, 5), "even"),
        (lambda: MSSMKernel(6, 4, heads=4), "multiple of heads"),
        (lambda: DSSKernel(2, 4, variant="cosine"), "unknown DSS variant"),
        (lambda: S4DKernel(2, 4, init="legt"), "unknown S4D init"),
        (lambda: MSSMKernel(0, 4), "positive"),
    ],
)
def test_bad_configuration(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_lengths():
    with pytest.raises(ValueError, match="exceeds the S4 kernel's l_max=16"):
        S4Kernel(2, 4, l_max=16)(17)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="positive int"):
            MSSMKernel(2, 4)(bad)


@pytest.mark.parametrize("name", ["mssm", "dss_softmax"])
def test_inference_reuses_the_kernel_until_a_parameter_changes(name):
    torch.manual_seed(0)
    kernel = MSSMKernel(8, 4, 2, heads=2) if name == "mssm" else DSSKernel(8, 4, variant="softmax")
    kernel.eval()
    with torch.no_grad():
        long_kernel, _ = kernel(40)
        assert kernel(40)[0] is long_kernel  # reused
        short, _ = kernel(25)
        assert torch.allclose(short, kernel.kernel(25), atol=1e-6)  # a prefix, or recomputed for DSS-softmax
        next(kernel.parameters()).add_(0.1)  # a parameter changes: recomputed
        assert torch.allclose(kernel(25)[0], kernel.kernel(25), atol=1e-6)
        assert not torch.allclose(kernel(25)[0], short)
    kernel.train()
    trained, _ = kernel(25)  # training never uses the cache
    assert trained.requires_grad


def test_batched_mssm_kernels_equal_the_kernels_generated_one_by_one():
    from ssm_fairseq.ssm.batched_kernels import batched_kernels, can_batch

    torch.manual_seed(0)
    kernels = [MSSMKernel(8, 4, out_channels=2, heads=2).double() for _ in range(3)]
    weights = [torch.randn(2, 8, 21, dtype=torch.float64) for _ in kernels]

    def loss_and_grads(outputs):
        for k in kernels:
            k.zero_grad()
        sum((K * w).sum() + D.square().sum() for (K, D), w in zip(outputs, weights)).backward()
        return [[p.grad.clone() for p in k.parameters()] for k in kernels]

    one_by_one = [k(21) for k in kernels]
    expected_grads = loss_and_grads(one_by_one)
    assert can_batch(kernels)
    rng = torch.get_rng_state()
    batched = batched_kernels(kernels, 21)
    assert torch.equal(torch.get_rng_state(), rng), "batching must not draw random numbers (exact resume)"
    for (K, D), (K_ref, D_ref) in zip(batched, one_by_one):
        torch.testing.assert_close(K, K_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(D, D_ref)
    for grads, expected in zip(loss_and_grads(batched), expected_grads):
        for g, e in zip(grads, expected):
            torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


def test_batched_kernels_give_each_parameter_its_gradient_without_a_copy_per_kernel():
    """The gradients of kernels generated together reach their parameters contiguous, in a backward pass whose copies
    do not grow with the number of kernels (autograd copied each kernel's strided slice of ``C``'s gradient)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ssm_fairseq.ssm.batched_kernels import batched_kernels

    class Copies(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("copy_", "clone"):
                Copies.count += 1
            return func(*args, **(kwargs or {}))

    def copies_in_backward(n):
        kernels = [MSSMKernel(8, 4, out_channels=2, heads=2) for _ in range(n)]
        loss = sum(K.square().sum() for K, _ in batched_kernels(kernels, 9))
        Copies.count = 0
        with Copies():
            loss.backward()
        for kernel in kernels:
            assert all(p.grad.is_contiguous() for p in kernel.parameters() if p.grad is not None)
        return Copies.count

    assert copies_in_backward(2) == copies_in_backward(5)


def test_kernels_that_cannot_be_batched_are_generated_one_by_one():
    from ssm_fairseq.ssm.batched_kernels import batched_kernels, can_batch

    different_heads = [MSSMKernel(8, 4, heads=2), MSSMKernel(8, 4, heads=4)]
    mixed_types = [MSSMKernel(8, 4), S4DKernel(8, 4)]
    assert not can_batch(different_heads) and not can_batch(mixed_types) and not can_batch(different_heads[:1])
    with torch.no_grad():  # inference: each kernel keeps its own cache
        assert not can_batch([MSSMKernel(8, 4).eval(), MSSMKernel(8, 4).eval()])
    for kernels in (different_heads, mixed_types):
        for (K, D), kernel in zip(batched_kernels(kernels, 10), kernels):
            K_ref, D_ref = kernel(10)
            torch.testing.assert_close(K, K_ref)
            torch.testing.assert_close(D, D_ref)
