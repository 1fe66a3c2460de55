"""The causal SSM sub-layer's step mode: equal to its convolution, its recurrence reused across sequences only while
the kernel is unchanged."""
from __future__ import annotations

import pytest
import torch

from ssm_fairseq.layers.state_space.causal_ssm import CausalSSM


def stepped(layer: CausalSSM, x: torch.Tensor) -> torch.Tensor:
    """``x`` (``B x L x D``) one position at a time through a fresh cache."""
    cache: dict = {}
    return torch.cat([layer.step(x[:, i : i + 1], cache) for i in range(x.shape[1])], 1)


@pytest.mark.parametrize("ssm", ["s4", "s4d", "dss", "mssm"])
def test_the_recurrence_is_reused_across_sequences_and_rebuilt_when_the_kernel_changes(ssm):
    torch.manual_seed(0)
    layer = CausalSSM(8, ssm, state_size=4, l_max=16, heads=2).double().eval()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(stepped(layer, x), layer(x), atol=1e-9, rtol=0)
        first = layer._kept_recurrence[1]
        torch.testing.assert_close(stepped(layer, x[:1]), layer(x[:1]), atol=1e-9, rtol=0)
        assert layer._kept_recurrence[1] is first  # the next sequence reused it
        next(layer.kernel.parameters()).mul_(1.5)  # as an optimiser step does, in place
        torch.testing.assert_close(stepped(layer, x), layer(x), atol=1e-9, rtol=0)
        assert layer._kept_recurrence[1] is not first
    layer.load_state_dict(CausalSSM(8, ssm, state_size=4, l_max=16, heads=2).double().state_dict())
    with torch.no_grad():
        torch.testing.assert_close(stepped(layer, x), layer(x), atol=1e-9, rtol=0)


def test_with_autograd_every_sequence_builds_its_own_and_gradients_reach_the_kernel():
    torch.manual_seed(0)
    layer = CausalSSM(8, "s4", state_size=4, l_max=16).double()
    stepped(layer, torch.randn(1, 6, 8, dtype=torch.float64)).square().sum().backward()
    assert layer._kept_recurrence is None
    assert layer.kernel.C.grad is not None and layer.kernel.C.grad.abs().sum() > 0
