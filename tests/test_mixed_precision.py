"""Every model family (transducers, SPADE LM, SPADE encoder-decoder, masked LM) in the two ways fairseq trains in
mixed precision: under CPU bf16 autocast (what --bf16 / --amp run) and with float16 weights (what --fp16 runs:
fairseq's FP16Optimizer halves the model and the batch's floating tensors, keeps float32 master weights and steps
them with these gradients). Loss and gradients close to float32's (within what the 8-bit or 10-bit mantissa allows),
and the SSM kernels and FFT convolutions computed in float32 inside."""
from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from fairseq.utils import apply_to_sample

import spade_cases
import transducer_cases
from ssm_fairseq.ssm import MSSMKernel
from ssm_fairseq.ssm.kernel import SSMKernel
from test_mssm_roberta import TINY, build as build_masked_lm
from test_spade_transformer import build as build_seq2seq


@pytest.fixture
def float32_inside(monkeypatch):
    """Records the dtype of every kernel (generated alone or in a batched generation) and every FFT spectrum computed
    during the test."""
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

    def recording_taps(*args):  # a batched generation of MSSM kernels (ssm/batched_kernels.py) calls taps directly
        K = taps(*args)
        seen["kernels"].add(K.dtype)
        return K

    taps = MSSMKernel.taps
    monkeypatch.setattr(SSMKernel, "forward", recording_forward)
    monkeypatch.setattr(MSSMKernel, "taps", staticmethod(recording_taps))
    monkeypatch.setattr(torch.fft, "rfft", recording_rfft)
    yield seen
    assert seen["kernels"] == {torch.float32} and seen["spectra"] == {torch.complex64}, seen


# bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9 = 0.2% per product), float16 10. Measured on these tiny
# models: the loss within 0.05% of float32's and the gradients' cosine above 0.99997 (bf16; float16 weights: above
# 0.99999); the bounds leave room for other CPUs.
LOSS_TOLERANCE = 0.01
GRADIENT_COSINE = 0.999
PRECISIONS = ("bf16 autocast", "fp16 weights")


def loss_and_gradients(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor]):
    loss = loss_fn(model)
    model.zero_grad()
    loss.backward()
    return loss.float(), torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])


def assert_close_to_float32(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor],
                            precision: str) -> None:
    """``loss_fn(model)`` in float32 and in ``precision`` (dropout off): finite, and close in loss and gradient.

    ``loss_fn`` reads the floating inputs it gives the model in the model's dtype (``in_dtype_of``)."""
    model.eval()  # no dropout: both passes compute the same function
    loss32, grad32 = loss_and_gradients(model, loss_fn)
    if precision == "bf16 autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss16, grad16 = loss_and_gradients(model, loss_fn)
    else:
        loss16, grad16 = loss_and_gradients(copy.deepcopy(model).half(), loss_fn)
    assert torch.isfinite(loss16) and torch.isfinite(grad16).all()
    assert grad32.count_nonzero() > 0
    assert abs(loss16.item() - loss32.item()) <= LOSS_TOLERANCE * abs(loss32.item()), (loss16.item(), loss32.item())
    cosine = F.cosine_similarity(grad16, grad32, dim=0).item()
    assert cosine >= GRADIENT_COSINE, cosine


def in_dtype_of(model: torch.nn.Module, sample):
    """``sample``'s floating tensors in ``model``'s dtype, as fairseq-train --fp16 passes a batch."""
    dtype = next(model.parameters()).dtype
    return apply_to_sample(lambda t: t.to(dtype) if t.is_floating_point() else t, sample)


def _spade_lm(ssm: str):
    """A 2-layer ``spade_lm`` of width 32 (window 8) with the given SSM."""
    return spade_cases.build("spade_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
                             "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4",
                             "--attention-window", "8", "--ssm", ssm, "--ssm-state-size", "8",
                             "--ssm-heads", "2" if ssm == "mssm" else "1")[0]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("arch", ["mssm_transducer", "stateformer_transducer", "s4_transducer"])
def test_transducers_in_mixed_precision(arch, precision, float32_inside):
    torch.manual_seed(0)
    model, criterion, _, task = transducer_cases.build(arch, *transducer_cases.SMALL)
    sample = transducer_cases.random_sample(task, [120, 90], [5, 3])
    assert_close_to_float32(model, lambda m: criterion(m, in_dtype_of(m, sample))[0], precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("ssm", ["s4", "s4d", "dss", "mssm"])
def test_spade_lm_in_mixed_precision(ssm, precision, float32_inside):
    torch.manual_seed(0)
    model = _spade_lm(ssm)
    tokens = torch.randint(4, 30, (2, 64))

    def loss(m):
        logits, _ = m(tokens)
        return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten())

    assert_close_to_float32(model, loss, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("arch", ["mssm_roberta_base", "local_roberta_base"])
def test_masked_lm_in_mixed_precision(arch, precision, request):
    if arch.startswith("mssm"):
        request.getfixturevalue("float32_inside")
    torch.manual_seed(0)
    model = build_masked_lm(arch, **TINY)
    tokens = torch.randint(4, 100, (2, 256))
    masked = torch.rand(tokens.shape) < 0.15

    def loss(m):
        logits, _ = m(tokens, masked_tokens=masked)
        return F.cross_entropy(logits.float(), tokens[masked])

    assert_close_to_float32(model, loss, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_spade_encoder_decoder_in_mixed_precision(precision, float32_inside):
    torch.manual_seed(0)
    model = build_seq2seq("spade_t5_small")
    src, prev = torch.randint(4, 40, (2, 48)), torch.randint(4, 40, (2, 12))

    def loss(m):
        logits, _ = m(src, torch.full((2,), 48), prev)
        return F.cross_entropy(logits.float().flatten(0, 1), prev.flatten())

    assert_close_to_float32(model, loss, precision)


@pytest.mark.parametrize("model_name", ["spade_lm s4", "spade_lm mssm", "spade_t5_small"])
@torch.no_grad()
def test_float16_incremental_decoding_equals_the_float16_full_forward(model_name):
    """What ``fairseq-generate --fp16`` runs for the text models: one token at a time (past the window of 8) in
    float16, against the full forward of the same float16 model (the S4 / MSSM step computes in float32 inside)."""
    torch.manual_seed(0)
    encoder_out = None
    if model_name == "spade_t5_small":
        model = build_seq2seq("spade_t5_small").eval().half()
        src, prev = torch.randint(4, 40, (2, 48)), torch.randint(4, 40, (2, 20))
        encoder_out = model.encoder(src, torch.full((2,), 48))
        full = model(src, torch.full((2,), 48), prev)[0]
    else:
        model = _spade_lm(model_name.split()[1]).eval().half()
        prev = torch.randint(4, 30, (2, 40))
        full = model(prev)[0]
    state: dict = {}
    steps = []
    for t in range(prev.shape[1]):
        logits, _ = model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)
        steps.append(logits[:, -1:])
    incremental = torch.cat(steps, dim=1)
    assert full.dtype == incremental.dtype == torch.float16
    torch.testing.assert_close(incremental.float(), full.float(), atol=1e-2, rtol=1e-2)
