import pytest
import torch

from ssm_fairseq.ssm import structured_products
from ssm_fairseq.ssm.structured_products import cauchy, real_vandermonde, vandermonde


def test_cauchy_matches_direct_sum_and_gradcheck():
    v = torch.randn(4, 3, 5, dtype=torch.complex128, requires_grad=True)  # rows share the poles below
    z = torch.randn(3, 7, dtype=torch.complex128, requires_grad=True)
    w = torch.randn(1, 5, dtype=torch.complex128, requires_grad=True)
    direct = (v.unsqueeze(-2) / (z.unsqueeze(-1) - w.unsqueeze(-2))).sum(-1)
    torch.testing.assert_close(cauchy(v, z, w), direct)
    assert torch.autograd.gradcheck(cauchy, (v, z, w))


def test_cauchy_in_chunks_matches_direct_sum_and_gradcheck(monkeypatch):
    monkeypatch.setattr(structured_products, "CAUCHY_CHUNK_ELEMENTS", 2 * 3 * 5)  # 2 positions per chunk
    v = torch.randn(4, 3, 5, dtype=torch.complex128, requires_grad=True)
    z = torch.randn(3, 7, dtype=torch.complex128, requires_grad=True)
    w = torch.randn(1, 5, dtype=torch.complex128, requires_grad=True)
    assert structured_products._chunk_length(torch.Size([3]), 5, 7, z.device) == 2
    direct = (v.unsqueeze(-2) / (z.unsqueeze(-1) - w.unsqueeze(-2))).sum(-1)
    torch.testing.assert_close(cauchy(v, z, w), direct)
    assert torch.autograd.gradcheck(cauchy, (v, z, w))


def test_cauchy_chunks_are_larger_on_a_gpu():
    # S4 at 16k tokens: 256 channels x 32 poles, 8193 points; the device only selects the size (no GPU needed)
    cpu = structured_products._chunk_length(torch.Size([256]), 32, 8193, torch.device("cpu"))
    cuda = structured_products._chunk_length(torch.Size([256]), 32, 8193, torch.device("cuda"))
    assert (cpu, cuda) == (32, 1024)


@pytest.mark.parametrize("L", [1, 2, 15, 16, 17, 50])
def test_vandermonde_matches_direct_powers(L):
    a = torch.randn(2, 3, 4, dtype=torch.complex128)
    b = torch.complex(-torch.rand(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64))
    b[0, 0] = 0.4 + 0.3j  # a growing row, offset by its largest position
    shift = torch.zeros(3, 4, dtype=torch.float64)
    shift[0, 0] = L - 1
    k = torch.arange(L, dtype=torch.float64)
    direct = (a.unsqueeze(-1) * torch.exp(b.unsqueeze(-1) * (k - shift.unsqueeze(-1)))).sum(-2).real
    torch.testing.assert_close(vandermonde(a, b, L, shift), direct)


def test_vandermonde_real_negative_bases_and_gradcheck():
    dA = torch.tensor([[0.9, -0.7, 0.2]], dtype=torch.float64)
    coef = torch.randn(1, 3, dtype=torch.float64, requires_grad=True)
    direct = (coef.unsqueeze(-1) * dA.unsqueeze(-1) ** torch.arange(10)).sum(-2)
    log_dA = torch.log(dA.to(torch.complex128))
    torch.testing.assert_close(vandermonde(coef, log_dA, 10), direct)
    b = (torch.randn(2, 3, dtype=torch.complex128) * 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda c, b: vandermonde(c, b, 11), (coef, b))


@pytest.mark.parametrize("L", [1, 2, 15, 16, 17, 50])
def test_real_vandermonde_matches_direct_powers_of_any_sign(L):
    base = torch.tensor([[0.9, -0.7, 0.2, -0.999, 0.0, -1.0]], dtype=torch.float64).expand(3, -1)
    a = torch.randn(2, 3, 6, dtype=torch.float64)
    direct = (a.unsqueeze(-1) * base.unsqueeze(-1) ** torch.arange(L, dtype=torch.float64)).sum(-2)
    torch.testing.assert_close(real_vandermonde(a, base, L), direct)


def test_real_vandermonde_gradcheck():
    a = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    base = (torch.rand(4, dtype=torch.float64) * 1.6 - 0.8).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: real_vandermonde(a, b, 13), (a, base))


@pytest.mark.parametrize("needs", ["a", "base"])
def test_real_vandermonde_one_gradient_alone_equals_the_direct_powers_gradient(needs):
    # The backward pass stacks both gradients' transposed products into one; with one input needing a gradient it
    # computes that one alone. Both against autograd through the direct powers.
    a = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=needs == "a")
    base = (torch.rand(3, 5, dtype=torch.float64) * 1.8 - 0.9).requires_grad_(needs == "base")
    g = torch.randn(2, 3, 11, dtype=torch.float64)
    (real_vandermonde(a, base, 11) * g).sum().backward()
    ours = (a if needs == "a" else base).grad
    a_, base_ = a.detach().requires_grad_(), base.detach().requires_grad_()
    (((a_.unsqueeze(-1) * base_.unsqueeze(-1) ** torch.arange(11, dtype=torch.float64)).sum(-2)) * g).sum().backward()
    torch.testing.assert_close(ours, a_.grad if needs == "a" else base_.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_real_vandermonde_zero_base_has_finite_gradients(dtype):
    # In float32, 1 + dt mu / 2 can round to exactly 0 during training: that base must not make a NaN gradient.
    base = torch.tensor([0.0, 0.5, -0.3], dtype=dtype, requires_grad=True)
    a = torch.tensor([1.0, 2.0, -1.0], dtype=dtype, requires_grad=True)
    out = real_vandermonde(a, base, 7)
    torch.testing.assert_close(out[0], a.sum() - 0.0)  # 0 ** 0 = 1 for every base
    out.sum().backward()
    assert torch.isfinite(base.grad).all() and torch.isfinite(a.grad).all()
    other = base.detach()[1:].clone().requires_grad_()  # the nonzero bases get their exact gradients
    direct = (a.detach()[1:, None] * other[:, None] ** torch.arange(7, dtype=dtype)).sum()
    direct.backward()
    torch.testing.assert_close(base.grad[1:], other.grad)
    torch.testing.assert_close(a.grad[0], torch.tensor(1.0, dtype=dtype))  # only 0 ** 0 contributes


def _saved_tensor_shapes(fn) -> list[tuple]:
    """Shapes of the tensors autograd keeps for the backward pass while ``fn()`` runs."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return shapes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_real_vandermonde_powers_stay_normal_and_accurate_when_they_underflow(dtype):
    # Fast decaying modes at speech lengths: most powers would be subnormal or zero, which is ten times slower on
    # CPU. The factors stay normal numbers and the kernel keeps the float64 brute force's value.
    base = torch.tensor([[1e-3, -1e-3, 0.5, -0.9, 0.0, 1e-30]], dtype=dtype).expand(3, -1)
    a = torch.randn(2, 3, 6, dtype=dtype)
    L = 300
    m = structured_products._block_length(L, 2)
    coarse, fine = structured_products._real_powers(*structured_products._magnitude_and_sign(base), L, m)
    tiny = torch.finfo(dtype).tiny
    for powers in (coarse, fine):  # normal numbers, or exactly 0 (a zero base's odd powers)
        assert ((powers.abs() >= tiny) | (powers == 0)).all()
    assert (powers[..., 1::2, 4] == 0).all() and (powers[..., ::2, :].abs() >= tiny).all()
    direct = (a.double().unsqueeze(-1) * base.double().unsqueeze(-1) ** torch.arange(L, dtype=torch.float64)).sum(-2)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(real_vandermonde(a, base, L).double(), direct, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("a_shape, base_shape", [((2, 3, 4), (3, 4)), ((3, 4), (2, 3, 4)), ((2, 1, 4), (3, 4)),
                                                 ((4,), (3, 4)), ((2, 3, 4), (1, 4))])
def test_real_vandermonde_broadcasts_and_keeps_only_its_inputs(a_shape, base_shape):
    a = torch.randn(*a_shape, dtype=torch.float64, requires_grad=True)
    base = (torch.rand(*base_shape, dtype=torch.float64) * 2 - 1).requires_grad_()
    L = 23
    saved = _saved_tensor_shapes(lambda: real_vandermonde(a, base, L))
    # the powers are recomputed in backward from the base's magnitude and sign (in the broadcast base shape), not kept
    batch = torch.broadcast_shapes(a_shape[:-1], base_shape[:-1])
    base_broadcast = tuple(batch[len(batch) - len(base_shape) + 1:]) + base_shape[-1:]
    assert sorted(saved) == sorted([a_shape, base_broadcast, base_broadcast])
    direct = (a.unsqueeze(-1) * base.unsqueeze(-1) ** torch.arange(L, dtype=torch.float64)).sum(-2)
    out = real_vandermonde(a, base, L)
    torch.testing.assert_close(out, direct)
    grad = torch.randn_like(direct)
    for ours, reference in zip(torch.autograd.grad(out, (a, base), grad), torch.autograd.grad(direct, (a, base), grad)):
        torch.testing.assert_close(ours, reference)
