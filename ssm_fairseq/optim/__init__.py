"""Learning-rate schedules registered with fairseq (``--lr-scheduler warmup_hold_exp_decay``)."""
from . import warmup_hold_exp_decay  # noqa: F401
