"""Every model family under CPU bf16 autocast (what --bf16 / --amp run): finite loss and gradients, and the SSM
kernels and FFT convolutions computed in float32 inside."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import spade_cases
import transducer_cases
from ssm_fairseq.ssm.kernel import SSMKernel
from test_mssm_roberta import TINY, build as build_masked_lm


@pytest.fixture
def float32_inside(monkeypatch):
    """Records the dtype of every kernel and every FFT spectrum computed during the test."""
    seen = {"kernels": set(), "spectra": set()}
    kernel_forward = SSMKernel.forward
    rfft = torch.fft.rfft

    def recording_forward(self, L):
        K, D = kernel_forward(self, L)
        seen["kernels"].add(K.dtype)
        return K, D

    def recording_rfft(*args, **kwargs):
        spectrum = rfft(*args, **kwargs)
        seen["spectra"].add(spectrum.dtype)
        return spectrum

    monkeypatch.setattr(SSMKernel, "forward", recording_forward)
    monkeypatch.setattr(torch.fft, "rfft", recording_rfft)
    yield seen
    assert seen["kernels"] == {torch.float32} and seen["spectra"] == {torch.complex64}, seen


def assert_finite_gradients(model: torch.nn.Module, loss: torch.Tensor) -> None:
    assert torch.isfinite(loss), loss
    loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad and p.grad is not None:
            assert torch.isfinite(p.grad).all(), name
    assert any(p.grad is not None and p.grad.count_nonzero() for p in model.parameters())


@pytest.mark.parametrize("arch", ["mssm_transducer", "stateformer_transducer", "s4_transducer"])
def test_transducers_under_bf16_autocast(arch, float32_inside):
    torch.manual_seed(0)
    model, criterion, _, task = transducer_cases.build(arch, *transducer_cases.SMALL)
    sample = transducer_cases.random_sample(task, [120, 90], [5, 3])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = criterion(model, sample)
    assert_finite_gradients(model, loss)


@pytest.mark.parametrize("ssm", ["s4", "s4d", "dss", "mssm"])
def test_spade_lm_under_bf16_autocast(ssm, float32_inside):
    torch.manual_seed(0)
    model, _, _ = spade_cases.build("spade_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
                                    "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4",
                                    "--attention-window", "8", "--ssm", ssm, "--ssm-state-size", "8",
                                    "--ssm-heads", "2" if ssm == "mssm" else "1")
    tokens = torch.randint(4, 30, (2, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(tokens)
        loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten())
    assert_finite_gradients(model, loss)


@pytest.mark.parametrize("arch", ["mssm_roberta_base", "local_roberta_base"])
def test_masked_lm_under_bf16_autocast(arch, request):
    if arch.startswith("mssm"):
        request.getfixturevalue("float32_inside")
    torch.manual_seed(0)
    model = build_masked_lm(arch, **TINY)
    tokens = torch.randint(4, 100, (2, 256))
    masked = torch.rand(tokens.shape) < 0.15
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(tokens, masked_tokens=masked)
        loss = F.cross_entropy(logits.float(), tokens[masked])
    assert_finite_gradients(model, loss)
