"""The MSSM discrete system's own backward pass against finite differences and against autograd's composition."""
import pytest
import torch

from ssm_fairseq.ssm.discretization import bilinear_diagonal
from ssm_fairseq.ssm.mssm_system import discrete_system, eigen_system


def parameters(heads, channels_per_head, N, out_channels, dt_shift=0.0, seed=0):
    """Random float64 parameters as ``MSSMKernel`` draws them; ``dt_shift`` moves ``log dt`` (a large step makes
    some ``dA`` negative)."""
    g = torch.Generator().manual_seed(seed)
    H = heads * channels_per_head
    return [torch.randn(heads, N, generator=g, dtype=torch.float64) + torch.log(torch.tensor(0.5)),
            torch.randn(heads, N, generator=g, dtype=torch.float64),
            torch.randn(heads, N, generator=g, dtype=torch.float64),
            torch.randn(out_channels, H, N, generator=g, dtype=torch.float64),
            torch.randn(H, generator=g, dtype=torch.float64) + dt_shift]


def composed(z_lambda, p, B, C, z_dt):
    """The same system as a composition of autograd operators (eigh, then the elementwise bilinear rule)."""
    mu, _, b, c = eigen_system(z_lambda, p, B, C)
    heads = mu.shape[0]
    dA, dB = bilinear_diagonal(mu.unsqueeze(1), b.unsqueeze(1), torch.exp(z_dt).view(heads, -1, 1))
    return dA.flatten(0, 1), dB.flatten(0, 1), c


CASES = [(1, 3, 4, 1, 0.0), (2, 2, 5, 2, 0.0), (3, 1, 3, 2, 3.0)]


@pytest.mark.parametrize("case", CASES)
def test_gradcheck(case):
    values = tuple(t.requires_grad_() for t in parameters(*case))
    assert torch.autograd.gradcheck(discrete_system, values, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("used", [(0, 1, 2), (0, 2), (1,)])
def test_equals_autograd_composition(case, used):
    """Values and gradients (random output gradients, some outputs unused) equal autograd's own."""
    values = parameters(*case, seed=1)
    results = []
    for system in (discrete_system, composed):
        leaves = [t.clone().requires_grad_() for t in values]
        outputs = system(*leaves)
        g = torch.Generator().manual_seed(2)
        loss = sum((outputs[i] * torch.randn(outputs[i].shape, generator=g, dtype=torch.float64)).sum() for i in used)
        loss.backward()
        # a parameter that reaches no used output: None from autograd, zeros from the one node
        grads = [torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for leaf in leaves]
        results.append(([o.detach() for o in outputs], grads))
    (ours, our_grads), (reference, reference_grads) = results
    for mine, theirs in zip(ours + our_grads, reference + reference_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-9, atol=1e-11)
    if case[-1]:  # the large step: some dA negative, as the bilinear rule allows
        assert (ours[0] < 0).any()
