"""The opt-in compiled encoder (``--compile-encoder``, ``layers/compiled.py``) against the eager one on a tiny model.

Inductor is slow to compile even at this size (it generates and builds C++ for each graph), so it compiles one tiny
MSSM transducer for one length bucket, in training (forward and backward) and in inference; the other buckets,
batch sizes and the padding logic are checked through dynamo and autograd with ``aot_eager`` (no code generation).
Compiled outputs and gradients equal the eager encoder's within float32 rounding.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from ssm_fairseq.layers.compiled import MIN_BUCKET, bucket_length, is_compiled, uncompile_layers
from transducer_cases import SMALL, build

TINY = (*SMALL, "--encoder-layers", "1", "--ssm-heads", "2", "--encoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--subsampler", "tr")


def test_bucket_lengths_are_powers_of_two_and_three_halves():
    assert [bucket_length(n) for n in (1, 16, 17, 24, 25, 33, 48, 49, 97, 875)] == [
        16, 16, 24, 24, 32, 48, 48, 64, 128, 1024]
    for n in range(1, 2000):
        bucket = bucket_length(n)
        assert bucket >= max(n, MIN_BUCKET) and (n <= MIN_BUCKET or 3 * (bucket - n) < bucket)  # padding < 1/3
    with pytest.raises(ValueError, match="positive"):
        bucket_length(0)


@pytest.fixture(scope="module")
def models():
    """The same tiny ``mssm_transducer`` built with and without ``--compile-encoder`` (same seed, same weights)."""
    torch.manual_seed(0)
    eager, *_ = build("mssm_transducer", *TINY)
    torch.manual_seed(0)
    compiled, *_ = build("mssm_transducer", *TINY, "--compile-encoder")
    return eager, compiled


def test_compile_encoder_keeps_the_state_dict(models):
    eager, compiled = models
    assert all(is_compiled(layer) for layer in compiled.encoder.layers)
    assert not any(is_compiled(layer) for layer in eager.encoder.layers)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    for name, tensor in eager.state_dict().items():
        assert torch.equal(tensor, compiled.state_dict()[name]), name
    compiled.load_state_dict(eager.state_dict())  # a checkpoint of the eager model loads into the compiled one


def _batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(len(lengths), max(lengths), 80, generator=generator)
    lengths = torch.tensor(lengths)
    features[torch.arange(features.shape[1]) >= lengths[:, None]] = 0
    return features, lengths


def _encoder_step(model, lengths: list[int], seed: int, train: bool) -> tuple[torch.Tensor, dict]:
    """The encoder's outputs at real frames and, in training, the gradients of their mean square."""
    model.train(train)
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(train):
        out = model.encoder(*_batch(lengths, seed))
        real = out["encoder_out"][~out["padding_mask"]]  # padded frames' outputs take no part
        if train:
            real.square().mean().backward()
    return real.detach(), {name: p.grad for name, p in model.encoder.named_parameters() if train}


def _assert_equal_steps(eager, compiled, lengths: list[int], seed: int, train: bool) -> None:
    (eager_out, eager_grads), (out, grads) = (_encoder_step(m, lengths, seed, train) for m in (eager, compiled))
    torch.testing.assert_close(out, eager_out, rtol=1e-4, atol=1e-5, msg=lambda m: f"outputs, batch {lengths}: {m}")
    for name, grad in eager_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"gradient of {name}, batch {lengths}: {m}")


# feature frames (the tr sub-sampler's stride is 4): 23 and 20 encoder frames, bucket 24; then a third utterance
ONE_BUCKET = ([92, 80], [92, 80, 61])


@pytest.mark.slow  # inductor builds C++ for each graph: about 3 minutes on a busy 2-core machine
def test_inductor_training_step_and_inference_equal_eager(models):
    """``--compile-encoder`` as built (inductor): outputs and gradients in training, outputs in inference; a batch
    of another size in the same bucket reuses the graphs (dynamic batch dimension)."""
    eager, compiled = models
    _assert_equal_steps(eager, compiled, ONE_BUCKET[0], 0, train=True)
    graphs = counters["stats"]["unique_graphs"]
    _assert_equal_steps(eager, compiled, ONE_BUCKET[1], 1, train=True)
    assert counters["stats"]["unique_graphs"] == graphs, "a new batch size in the same bucket compiled again"
    _assert_equal_steps(eager, compiled, ONE_BUCKET[0], 2, train=False)


# other buckets (9 encoder frames: 16; 40: 48), one utterance alone (its batch dimension of 1 is specialised), and a
# batch without padding (48 frames: bucket 48 again, so it runs the graphs of [160, 100] instead of tracing new ones)
OTHER_BUCKETS = ([36], [160, 100], [192, 192])


@pytest.mark.slow  # dynamo traces each bucket, training and inference: about 100 s on a busy 2-core machine
def test_every_bucket_equals_eager(models):
    """Padding to buckets and cutting back, through dynamo and autograd without code generation (``aot_eager``,
    seconds): the padded frames never reach the real ones, forward and backward."""
    eager, compiled = models
    compiled.compile_encoder_layers(backend="aot_eager")
    try:
        for seed, lengths in enumerate(OTHER_BUCKETS):
            for train in (True, False):
                _assert_equal_steps(eager, compiled, lengths, seed, train)
    finally:
        compiled.compile_encoder_layers()  # inductor again, as built


@pytest.mark.slow  # may compile the copy's graphs again
def test_a_copied_compiled_model_runs_its_own_weights(models):
    """``copy.deepcopy`` (fairseq's ``--ema`` keeps such a copy): the copy's compiled layers use the copy's weights."""
    eager, compiled = models
    copies = [copy.deepcopy(model) for model in (eager, compiled)]
    for model in copies:
        with torch.no_grad():
            for parameter in model.encoder.layers.parameters():
                parameter.mul_(0.5)
    assert is_compiled(copies[1].encoder.layers[0])
    assert copies[1].encoder.layers[0].forward.eager.__self__ is copies[1].encoder.layers[0]
    _assert_equal_steps(*copies, ONE_BUCKET[0], 3, train=False)
    copied, _ = _encoder_step(copies[1], ONE_BUCKET[0], 3, train=False)
    original, _ = _encoder_step(compiled, ONE_BUCKET[0], 3, train=False)
    assert not torch.allclose(copied, original), "the copy ran the original's weights"


def test_uncompiled_layers_run_eagerly(models):
    _, compiled = models
    layer = compiled.encoder.layers[0]
    uncompile_layers([layer])
    assert not is_compiled(layer) and "forward" not in layer.__dict__
    compiled.compile_encoder_layers()  # what a caller with a built model (ssm-transcribe) does
    assert is_compiled(compiled.encoder.layers[0])
