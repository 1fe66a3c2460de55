"""The transducer model through fairseq's registries: parameter counts, one update per architecture, criterion."""
from __future__ import annotations

import logging

import pytest
import torch
from fairseq import optim

from transducer_cases import ARCHITECTURES, SMALL, Task, build, random_sample

# Tables 2 and 3 of the MSSM paper, with a 4097-unit output layer
PAPER_PARAMETERS = {
    "mssm_transducer": 79.2e6,
    "mssm_transducer_streaming": 79.2e6,  # Table 2's mssm_transducer size, causal
    "mssm_transducer_large": 140.3e6,
    "stateformer_transducer": 96.1e6,
    "stateformer_transducer_large": 139.8e6,
    "transformer_transducer": 77.5e6,
    "conformer_transducer": 92.7e6,
    "s4_transducer": 78.8e6,
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_parameter_count_matches_the_paper(arch):
    model = build(arch, vocab_size=4097)[0]
    # the auxiliary CTC classifiers of the large models are training aids, not part of the paper's counts
    count = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("aux_ctc."))
    print(f"{arch}: {count / 1e6:.1f}M parameters (paper {PAPER_PARAMETERS[arch] / 1e6:.1f}M)")
    assert abs(count / PAPER_PARAMETERS[arch] - 1) < 0.02  # the issue asks for 10%; all are within 1.7%


def _small(arch: str) -> tuple[str, ...]:
    # the large architectures keep their auxiliary CTC classifiers: put one after layer 1 of 2
    return SMALL + (("--aux-ctc-every", "1") if arch.endswith("_large") else ())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_one_update_reaches_every_parameter(arch):
    model, criterion, cfg, task = build(arch, *_small(arch))
    optimizer = optim.build_optimizer(cfg.optimizer, list(model.parameters()))
    sample = random_sample(task, [37, 50, 29], [4, 6, 3])
    model.train()
    loss, sample_size, log = criterion(model, sample)
    assert torch.isfinite(loss) and sample_size == 13 and log["dropped"] == 0
    optimizer.backward(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer.step()
    assert all(not torch.equal(before[name], p) for name, p in model.named_parameters())


def test_architecture_flags_override_defaults():
    model = build("mssm_transducer", *SMALL, "--ssm-heads", "2", "--ssm-gating", "glu", "--ssm-stack", "1",
                  "--subsampler", "tr")[0]
    ssm = model.encoder.layers[0].blocks[0].block.forward_ssm
    assert (ssm.heads, ssm.gating, len(ssm.kernels)) == (2, "glu", 1)
    assert type(model.encoder.subsampler).__name__ == "TimeReductionSubsampler"


def test_utterance_too_short_is_dropped_and_logged(caplog):
    model, criterion, cfg, task = build("transformer_transducer", *SMALL)
    sample = random_sample(task, [40, 5, 33], [3, 2, 4])  # 5 frames -> no frame after the stride-4 conv
    with caplog.at_level(logging.WARNING):
        loss, sample_size, log = criterion(model, sample)
    assert log["dropped"] == 1 and sample_size == 7 and log["nsentences"] == 2
    assert "id=1" in caplog.text and "no frames" in caplog.text
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    keep = torch.tensor([0, 2])  # the same batch without the short utterance gives the same loss
    alone = random_sample(task, [40, 33], [3, 4])
    alone["net_input"]["src_tokens"] = sample["net_input"]["src_tokens"][keep, :40]
    alone["target"], alone["target_lengths"] = sample["target"][keep], sample["target_lengths"][keep]
    model.eval()
    with torch.no_grad():
        assert torch.allclose(criterion(model, sample)[0], criterion(model, alone)[0], rtol=1e-5)


def test_every_utterance_dropped_gives_a_zero_step():
    model, criterion, cfg, task = build("transformer_transducer", *SMALL)
    loss, sample_size, log = criterion(model, random_sample(task, [4, 6], [2, 1]))
    loss.backward()
    assert loss.item() == 0 and sample_size == 0 and log["dropped"] == 2


def test_sub_batched_joint_gives_the_same_loss_and_gradients():
    model, criterion, cfg, task = build("mssm_transducer", *SMALL)
    sub_criterion = build("mssm_transducer", *SMALL, "--joint-sub-batch", "1")[1]
    sample = random_sample(task, [41, 52, 30], [4, 6, 3])
    grads = []
    for crit in (criterion, sub_criterion):
        model.zero_grad()
        loss = crit(model, sample)[0]
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.allclose(grads[0][0], grads[1][0], rtol=1e-5)
    for g0, g1 in zip(grads[0][1], grads[1][1]):
        assert torch.allclose(g0, g1, rtol=1e-4, atol=1e-6)


def test_auxiliary_ctc_adds_a_weighted_loss():
    model, criterion, cfg, task = build("mssm_transducer", *SMALL, "--aux-ctc-every", "1", "--aux-ctc-weight", "0.5")
    sample = random_sample(task, [60, 52], [4, 6])
    model.eval()
    loss, _, log = criterion(model, sample)
    assert log["aux_ctc_loss"] > 0
    assert torch.allclose(loss, log["rnnt_loss"] + 0.5 * log["aux_ctc_loss"])


def test_auxiliary_ctc_needs_a_layer_below_the_top():
    with pytest.raises(ValueError, match="--aux-ctc-every 2 takes outputs below the top layer"):
        build("mssm_transducer", *SMALL, "--aux-ctc-every", "2")


@pytest.mark.parametrize("criterion_args", [(), ("--rnnt-loss", "pruned", "--prune-range", "3")])
def test_every_parameter_gets_a_gradient_when_every_utterance_is_dropped(criterion_args):
    """DistributedDataParallel (fairseq's default --ddp-backend) fails when a parameter gets no gradient."""
    model, criterion, cfg, task = build("mssm_transducer", *SMALL, "--aux-ctc-every", "1", *criterion_args)
    sample = random_sample(task, [40, 30], [3, 2])
    sample["net_input"]["src_tokens"][:, 0, 0] = float("nan")  # both utterances are dropped
    loss, _, log = criterion(model, sample)
    assert log["dropped"] == 2
    loss.backward()
    for name, p in [*model.named_parameters(), *criterion.named_parameters()]:
        assert p.grad is not None and not p.grad.any(), name


def test_reduce_metrics_reports_per_token_loss_in_base_2():
    from fairseq import metrics

    model, criterion, cfg, task = build("mssm_transducer", *SMALL)
    logs = [criterion(model, random_sample(task, [40, 30], [3, 2]))[2] for _ in range(2)]
    with metrics.aggregate() as agg:
        type(criterion).reduce_metrics(logs)
    total = sum(log["loss"] for log in logs) / sum(log["sample_size"] for log in logs) / torch.log(torch.tensor(2.0))
    assert abs(agg.get_smoothed_values()["loss"] - total.item()) < 1e-3


def test_predictor_step_by_step_equals_full_sequence():
    model = build("mssm_transducer", *SMALL)[0].eval()
    tokens = torch.randint(4, 11, (3, 7))
    full, _ = model.predictor(tokens)
    state, steps = None, []
    for u in range(tokens.shape[1]):
        out, state = model.predictor(tokens[:, u : u + 1], state)
        steps.append(out)
    assert torch.allclose(full, torch.cat(steps, 1), atol=1e-6)


def test_task_vocabulary_sets_the_output_layer():
    model = build("mssm_transducer", *SMALL, vocab_size=23)[0]
    assert model.joiner.output.out_features == 23 and model.blank == Task(23).target_dictionary.bos()
