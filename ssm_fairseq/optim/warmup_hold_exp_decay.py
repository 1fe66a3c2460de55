"""``warmup_hold_exp_decay``: the MSSM paper's schedule (section 4.1).

Linear warmup to the peak ``--lr`` over ``--warmup-updates`` (8000), hold the peak until epoch
``--hold-until-epoch`` (60), then multiply by ``--decay-per-epoch`` (0.96) at the start of every later epoch::

    lr(update n, epoch e) = peak * min(1, n / warmup_updates) * decay_per_epoch ** max(0, e - hold_until_epoch)

Epochs count from 1 as in fairseq, so epoch ``hold_until_epoch + 1`` is the first decayed one.
"""
from collections.abc import Collection
from dataclasses import dataclass, field

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II


@dataclass
class WarmupHoldExpDecayConfig(FairseqDataclass):
    """Options of ``--lr-scheduler warmup_hold_exp_decay``; the peak is the optimizer's one ``--lr``."""

    warmup_updates: int = field(default=8000, metadata={"help": "linear warmup from 0 to --lr over N updates"})
    hold_until_epoch: int = field(default=60, metadata={"help": "keep the peak --lr until the end of this epoch"})
    decay_per_epoch: float = field(default=0.96, metadata={"help": "multiply the lr by this every later epoch"})
    lr: list[float] = II("optimization.lr")


@register_lr_scheduler("warmup_hold_exp_decay", dataclass=WarmupHoldExpDecayConfig)
class WarmupHoldExpDecaySchedule(FairseqLRScheduler):
    """``--lr-scheduler warmup_hold_exp_decay``: linear warmup over ``--warmup-updates``, the peak ``--lr`` held
    until ``--hold-until-epoch``, then times ``--decay-per-epoch`` each later epoch (formula in the module doc)."""

    def __init__(self, cfg: WarmupHoldExpDecayConfig, optimizer):
        super().__init__(cfg, optimizer)
        if isinstance(cfg.lr, Collection) and len(cfg.lr) > 1:
            raise ValueError("warmup_hold_exp_decay takes one peak --lr, got " + ",".join(map(str, cfg.lr)))
        if cfg.warmup_updates < 0 or cfg.hold_until_epoch < 0 or not 0 < cfg.decay_per_epoch <= 1:
            raise ValueError(
                "warmup_hold_exp_decay needs --warmup-updates >= 0, --hold-until-epoch >= 0 and "
                f"0 < --decay-per-epoch <= 1; got {cfg.warmup_updates}, {cfg.hold_until_epoch}, {cfg.decay_per_epoch}"
            )
        self.peak = cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr
        self.num_updates, self.epoch = 0, 1
        self._apply()

    def learning_rate(self, num_updates: int, epoch: int) -> float:
        """The schedule as a function of the update count and the (1-based) epoch."""
        warmup = min(1.0, num_updates / self.cfg.warmup_updates) if self.cfg.warmup_updates > 0 else 1.0
        return self.peak * warmup * self.cfg.decay_per_epoch ** max(0, epoch - self.cfg.hold_until_epoch)

    def _apply(self) -> float:
        lr = self.learning_rate(self.num_updates, self.epoch)
        self.optimizer.set_lr(lr)
        return lr

    def step_begin_epoch(self, epoch: int) -> float:
        self.epoch = epoch
        return self._apply()

    def step(self, epoch: int, val_loss: float | None = None) -> float:
        """End of ``epoch``: the next epoch's decay applies from its first update."""
        super().step(epoch, val_loss)
        self.epoch = epoch + 1
        return self._apply()

    def step_update(self, num_updates: int) -> float:
        self.num_updates = num_updates
        return self._apply()
