"""Every model family under CPU bf16 autocast (what --bf16 / --amp run): loss and gradients close to float32's
(within what bfloat16's 8-bit mantissa allows), and the SSM kernels and FFT convolutions computed in float32 inside."""
from __future__ import annotations

from typing import Callable

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


# bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9 = 0.2% per product). Measured on these tiny models:
# the loss within 0.05% of float32's and the gradients' cosine above 0.99997; the bounds leave room for other CPUs.
LOSS_TOLERANCE = 0.01
GRADIENT_COSINE = 0.999


def gradients(model: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])


def assert_bf16_close_to_float32(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor]) -> None:
    """``loss_fn()`` in float32 and under bf16 autocast (dropout off): finite, and close in loss and gradient."""
    model.eval()  # no dropout: both passes compute the same function
    loss32 = loss_fn()
    grad32 = gradients(model, loss32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss16 = loss_fn()
    grad16 = gradients(model, loss16)
    assert torch.isfinite(loss16) and torch.isfinite(grad16).all()
    assert grad32.count_nonzero() > 0
    assert abs(loss16.item() - loss32.item()) <= LOSS_TOLERANCE * abs(loss32.item()), (loss16.item(), loss32.item())
    cosine = F.cosine_similarity(grad16, grad32, dim=0).item()
    assert cosine >= GRADIENT_COSINE, cosine


@pytest.mark.parametrize("arch", ["mssm_transducer", "stateformer_transducer", "s4_transducer"])
def test_transducers_under_bf16_autocast(arch, float32_inside):
    torch.manual_seed(0)
    model, criterion, _, task = transducer_cases.build(arch, *transducer_cases.SMALL)
    sample = transducer_cases.random_sample(task, [120, 90], [5, 3])
    assert_bf16_close_to_float32(model, lambda: criterion(model, sample)[0])


@pytest.mark.parametrize("ssm", ["s4", "s4d", "dss", "mssm"])
def test_spade_lm_under_bf16_autocast(ssm, float32_inside):
    torch.manual_seed(0)
    model, _, _ = spade_cases.build("spade_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
                                    "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4",
                                    "--attention-window", "8", "--ssm", ssm, "--ssm-state-size", "8",
                                    "--ssm-heads", "2" if ssm == "mssm" else "1")
    tokens = torch.randint(4, 30, (2, 64))

    def loss():
        logits, _ = model(tokens)
        return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten())

    assert_bf16_close_to_float32(model, loss)


@pytest.mark.parametrize("arch", ["mssm_roberta_base", "local_roberta_base"])
def test_masked_lm_under_bf16_autocast(arch, request):
    if arch.startswith("mssm"):
        request.getfixturevalue("float32_inside")
    torch.manual_seed(0)
    model = build_masked_lm(arch, **TINY)
    tokens = torch.randint(4, 100, (2, 256))
    masked = torch.rand(tokens.shape) < 0.15

    def loss():
        logits, _ = model(tokens, masked_tokens=masked)
        return F.cross_entropy(logits.float(), tokens[masked])

    assert_bf16_close_to_float32(model, loss)
