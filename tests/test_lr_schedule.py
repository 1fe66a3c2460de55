"""The warmup_hold_exp_decay learning-rate schedule, built through fairseq's registry."""
from argparse import Namespace

import pytest
import torch
from fairseq.optim.lr_scheduler import build_lr_scheduler
from fairseq.optim.sgd import SGD
from omegaconf import OmegaConf

import ssm_fairseq  # noqa: F401  (registers the schedule)
from ssm_fairseq.optim.warmup_hold_exp_decay import WarmupHoldExpDecayConfig

PEAK = 1e-3


def schedule(**overrides):
    optimizer = SGD(Namespace(lr=[PEAK], momentum=0.0, weight_decay=0.0), [torch.nn.Parameter(torch.zeros(1))])
    cfg = OmegaConf.structured(WarmupHoldExpDecayConfig(lr=[PEAK], **overrides))
    cfg._name = "warmup_hold_exp_decay"
    return build_lr_scheduler(cfg, optimizer), optimizer


def test_paper_curve_at_chosen_updates_and_epochs():
    scheduler, optimizer = schedule()  # 8000 warmup updates, hold until epoch 60, x0.96 per epoch
    assert optimizer.get_lr() == 0.0
    for update, expected in [(1, PEAK / 8000), (2000, PEAK / 4), (4000, PEAK / 2), (8000, PEAK), (50_000, PEAK)]:
        assert scheduler.step_update(update) == pytest.approx(expected)
        assert optimizer.get_lr() == pytest.approx(expected)
    for epoch, expected in [(2, PEAK), (60, PEAK), (61, PEAK * 0.96), (62, PEAK * 0.96**2), (100, PEAK * 0.96**40),
                            (200, PEAK * 0.96**140)]:
        assert scheduler.step_begin_epoch(epoch) == pytest.approx(expected, rel=1e-12)
        assert scheduler.step_update(50_000 + epoch) == pytest.approx(expected, rel=1e-12)  # updates keep it


def test_end_of_epoch_step_applies_the_next_epochs_decay():
    scheduler, optimizer = schedule(hold_until_epoch=3)
    scheduler.step_update(10_000)
    assert scheduler.step(3) == pytest.approx(PEAK * 0.96)  # fairseq calls step(epoch) when an epoch ends
    assert scheduler.step_begin_epoch(4) == pytest.approx(PEAK * 0.96)


def test_warmup_and_decay_compose_and_are_configurable():
    scheduler, _ = schedule(warmup_updates=100, hold_until_epoch=1, decay_per_epoch=0.5)
    scheduler.step_begin_epoch(3)
    assert scheduler.step_update(25) == pytest.approx(PEAK * 0.25 * 0.5**2)
    no_warmup, _ = schedule(warmup_updates=0)
    assert no_warmup.step_update(0) == PEAK


def test_state_survives_a_checkpoint_round_trip():
    scheduler, _ = schedule(hold_until_epoch=2)
    scheduler.step(1, val_loss=3.0)
    restored, _ = schedule(hold_until_epoch=2)
    restored.load_state_dict(scheduler.state_dict())
    assert restored.best == 3.0


@pytest.mark.parametrize("overrides", [{"decay_per_epoch": 0.0}, {"decay_per_epoch": 1.5}, {"warmup_updates": -1},
                                       {"hold_until_epoch": -2}])
def test_bad_settings_are_rejected(overrides):
    with pytest.raises(ValueError, match="warmup_hold_exp_decay"):
        schedule(**overrides)
