"""scripts/plot_kernels.py: kernels found in a state dict, rebuilt, and averaged per head exactly as the layer's."""
from __future__ import annotations

import pytest
import torch

from ssm_fairseq.cli import plot_kernels
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig


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


def _checkpoint(path) -> None:
    """A checkpoint holding one MSSM encoder layer, in the layout fairseq's loader reads."""
    layer = EncoderLayer("mssm", LayerConfig(dim=16, ffn_dim=32, ssm_heads=4, ssm_state_size=8))
    state = {f"encoder.layers.0.{k}": v for k, v in layer.state_dict().items()}
    history = [{"criterion_name": "c", "optimizer_name": "o", "lr_scheduler_state": {}, "num_updates": 0}]
    torch.save({"model": state, "optimizer_history": history, "args": None, "cfg": None, "extra_state": {}}, path)


def test_the_plot_goes_into_a_directory_that_does_not_exist_yet(tmp_path):
    _checkpoint(tmp_path / "model.pt")
    out = tmp_path / "plots/layer0/kernels.png"
    assert plot_kernels.main([str(tmp_path / "model.pt"), "--layer", "0", "--length", "20", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("length", ["0", "-5"])
def test_a_length_below_one_lag_is_refused(tmp_path, capsys, length):
    with pytest.raises(SystemExit) as stop:
        plot_kernels.main([str(tmp_path / "model.pt"), "--layer", "0", "--length", length, "-o",
                           str(tmp_path / "k.png")])
    assert stop.value.code == 2
    assert f"--length must be at least 1 lag, got {length}" in capsys.readouterr().err
