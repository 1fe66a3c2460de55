"""Mixed-precision transducer decoding: ``fairseq-generate --fp16`` and ``--bf16`` with ``--task speech_transducer``.

A tiny transducer trained a few updates by ``fairseq-train`` on the fixture corpus decodes its training utterances
in float16 and bfloat16 with float32's hypotheses, and scores them as float32 log-probabilities.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch

import transducer_cases
from cli import BIN, run_ok
from librispeech_fixture import TRANSCRIPTS, write_fixture
from ssm_fairseq.asr.search import TransducerGenerator
from ssm_fairseq.asr.search.hypothesis import joint_log_probs, start_predictor
from test_librispeech_recipe import TINY_MODEL

pytestmark = pytest.mark.slow

SPLIT = "train-fixture"
UTTERANCES = sum(map(len, TRANSCRIPTS[SPLIT].values()))
WORDS = sum(len(line.split()) for lines in TRANSCRIPTS[SPLIT].values() for line in lines)

# How far a hypothesis score (fairseq prints log2 P(y | x)) may be from float32's, in bits. A half-precision model is
# a slightly different model: rounding its weights and activations moves every log-probability of the lattice, by
# at most 0.004 nats in float16 and 0.03-0.06 nats in bfloat16 (measured on fixture models), and a score sums about
# 35 of them (15 encoder frames of these 0.6 s utterances and up to 20 labels): 0.2 and 1.5 bits at worst.
# Measured on this model: 0.01 and 0.27 bits.
SCORE_TOLERANCE_BITS = {"--fp16": 0.2, "--bf16": 1.5}


def prepare_fixture(root: Path, *options: str) -> Path:
    """The fixture corpus through the recipe's stage 1 (``scripts/prepare_librispeech.py``): its data directory."""
    data = root / "data"
    run_ok([sys.executable, "scripts/prepare_librispeech.py", "--librispeech-root", str(write_fixture(root)),
            "--out", str(data), "--subsets", "train-fixture,test-fixture", "--vocab-size", "24", "--jobs", "1",
            *options])
    return data


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """``(data directory, checkpoint)``: TINY_MODEL trained 40 updates on the three training utterances, without
    dropout or SpecAugment and at a high learning rate, so that it emits their words (float32 WER 60% here)."""
    root = tmp_path_factory.mktemp("fp16_decoding")
    data = prepare_fixture(root, "--no-specaugment")
    run_ok([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--train-subset", SPLIT, "--arch", "mssm_transducer", *TINY_MODEL.split(), "--dropout", "0",
            "--predictor-dropout", "0", "--criterion", "transducer", "--optimizer", "adam", "--lr", "2e-2",
            "--max-update", "40", "--batch-size", "3", "--required-batch-size-multiple", "1", "--disable-validation",
            "--no-epoch-checkpoints", "--save-dir", str(root / "ckpt"), "--num-workers", "0", "--cpu"])
    return data, root / "ckpt/checkpoint_last.pt"


def decode(trained: tuple[Path, Path], *flags: str) -> tuple[dict[int, tuple[float, str]], float]:
    """``fairseq-generate`` (beam 2) on the training split -> ({sample id: (score, hypothesis)}, WER)."""
    data, checkpoint = trained
    out = run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
                  "--path", str(checkpoint), "--gen-subset", SPLIT, "--beam", "2", "--scoring", "wer",
                  "--max-tokens", "10000", "--cpu", *flags])
    hypotheses = {int(i): (float(score), text)
                  for i, score, text in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", out, flags=re.M)}
    wer = re.search(r"^Generate .* WER: ([0-9.]+)$", out, flags=re.M)
    assert wer, out[-2000:]
    return hypotheses, float(wer.group(1))


@pytest.fixture(scope="module")
def float32(trained) -> tuple[dict[int, tuple[float, str]], float]:
    hypotheses, wer = decode(trained)
    assert sorted(hypotheses) == list(range(UTTERANCES))
    assert all(text for _, text in hypotheses.values()) and wer < 100, (hypotheses, wer)  # it emits words
    return hypotheses, wer


@pytest.mark.parametrize("flag", ["--fp16", "--bf16"])
def test_fairseq_generate_in_half_precision_decodes_like_float32(trained, float32, flag):
    """Every utterance decoded, the flag in effect (some score differs from float32's: ``--bf16`` used to decode
    silently in float32, ``--fp16`` crashed on the float32 batch), float32's hypotheses, and their scores within
    SCORE_TOLERANCE_BITS of float32's.

    Rounding can flip a decision that float32 takes by less than the rounding error, and this model has one (a
    greedy step won by 0.006 nats, against errors of up to 0.009 nats in float16 and 0.05 in bfloat16): one
    utterance may change by one unit, so the WER may differ by one word. On this machine all three are identical.
    """
    reference, reference_wer = float32
    hypotheses, wer = decode(trained, flag)
    assert sorted(hypotheses) == list(range(UTTERANCES))
    assert any(score != reference[i][0] for i, (score, _) in hypotheses.items()), f"{flag} decoded in float32"
    same = [i for i, (_, text) in hypotheses.items() if text == reference[i][1]]
    assert len(same) >= UTTERANCES - 1, (hypotheses, reference)
    assert abs(wer - reference_wer) <= 100 / WORDS + 1e-9, (wer, reference_wer)
    for i in same:
        assert abs(hypotheses[i][0] - reference[i][0]) <= SCORE_TOLERANCE_BITS[flag], (i, hypotheses[i], reference[i])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_joint_log_probs_are_float32_for_half_models(dtype):
    """The joiner of a half model gives half logits; the search's log-softmax runs in float32 (float64 stays)."""
    model = transducer_cases.build("mssm_transducer", *transducer_cases.SMALL)[0].eval().to(dtype)
    with torch.no_grad():
        encoder_rows = model.joiner.encoder_proj(torch.randn(5, 32, dtype=dtype))
        predictor_rows, _ = start_predictor(model, 5, torch.device("cpu"))
        log_probs = joint_log_probs(model, encoder_rows, predictor_rows, blank_penalty=0.5)
        logits = model.joiner.step(encoder_rows, predictor_rows)
    expected_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert log_probs.dtype == expected_dtype
    expected = logits.to(expected_dtype)
    expected[:, model.blank] -= 0.5
    assert torch.equal(log_probs, expected.log_softmax(-1))
    assert torch.allclose(log_probs.logsumexp(-1), torch.zeros(5, dtype=expected_dtype), atol=1e-6)


@pytest.mark.parametrize("beam", [1, 2])
def test_generator_decodes_a_float32_batch_with_a_half_model(beam):
    """What ``fairseq-generate`` hands the generator: a float32 batch, and a model it halved itself (``--fp16``)
    or one the generator converts (``dtype``, as ``--bf16``). Both decode; scores are float32 log-probabilities."""
    torch.manual_seed(0)
    model, _, _, task = transducer_cases.build("mssm_transducer", *transducer_cases.SMALL)
    sample = transducer_cases.random_sample(task, [40, 30], [5, 3])
    for convert, dtype in ((torch.nn.Module.half, None), (torch.nn.Module.float, torch.bfloat16)):
        models = [convert(model)]
        generator = TransducerGenerator(models, task.target_dictionary, beam=beam, max_symbols_per_frame=2,
                                        dtype=dtype)
        assert generator.model_dtype() == (dtype or torch.float16)
        results = generator.generate(models, sample)
        assert len(results) == 2
        for hypothesis in (hypotheses[0] for hypotheses in results):
            assert hypothesis["positional_scores"].dtype == torch.float32
            assert torch.isfinite(hypothesis["positional_scores"]).all() and hypothesis["score"] < 0
            assert hypothesis["positional_scores"].double().sum().item() == pytest.approx(hypothesis["score"])


def test_a_float16_overflow_stops_decoding_naming_the_samples():
    """Logits beyond float16's range (65504) would make NaN scores, hypotheses and a WER with exit 0: decoding stops
    instead. The same model in float32 decodes."""
    model, _, _, task = transducer_cases.build("mssm_transducer", *transducer_cases.SMALL)
    with torch.no_grad():
        model.joiner.output.weight.mul_(1e5)
    sample = transducer_cases.random_sample(task, [40, 30], [5, 3])
    sample["id"] = torch.tensor([7, 9])
    generator = TransducerGenerator([model], task.target_dictionary, max_symbols_per_frame=2)
    assert all(math.isfinite(hypotheses[0]["score"]) for hypotheses in generator.generate([model], sample))
    generator = TransducerGenerator([model], task.target_dictionary, max_symbols_per_frame=2, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"sample ids \[7, 9\]: hypothesis scores are not finite .*\(without --fp16\)"):
        generator.generate([model], sample)
