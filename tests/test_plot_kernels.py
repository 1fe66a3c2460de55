"""scripts/plot_kernels.py: kernels found in a state dict, rebuilt, and averaged per head exactly as the layer's."""
from __future__ import annotations

import torch

from ssm_fairseq.cli import plot_kernels
from ssm_fairseq.modules.encoder_layer import EncoderLayer, LayerConfig


def test_head_curves_are_the_layers_own_kernels_averaged_per_head():
    torch.manual_seed(0)
    cfg = LayerConfig(dim=16, ffn_dim=32, ssm_heads=4, ssm_state_size=8)
    layers = torch.nn.ModuleList([EncoderLayer("transformer", cfg), EncoderLayer("mssm", cfg)])
    state = {f"encoder.layers.{k}": v for k, v in layers.state_dict().items()}
    assert plot_kernels.layers_with_kernels(state) == [1]
    assert plot_kernels.kernel_prefixes(state, 0, 0) == {}
    prefixes = plot_kernels.kernel_prefixes(state, 1, 1)
    assert sorted(prefixes) == ["backward_ssm", "forward_ssm"]
    block = layers[1].blocks[0].block
    for direction, module in (("forward_ssm", block.forward_ssm), ("backward_ssm", block.backward_ssm)):
        curves = plot_kernels.head_curves(plot_kernels.rebuild_kernel(state, prefixes[direction]), 50, output=1)
        with torch.no_grad():
            K, _ = module.kernels[1](50)
        expected = K[1].view(4, 4, 50).mean(1)
        torch.testing.assert_close(curves, expected, atol=1e-6, rtol=1e-6)
        one = plot_kernels.head_curves(plot_kernels.rebuild_kernel(state, prefixes[direction]), 50, channel=2)
        torch.testing.assert_close(one, K[0].view(4, 4, 50)[:, 2], atol=1e-6, rtol=1e-6)
