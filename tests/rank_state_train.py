"""``fairseq-train`` that also writes each process's final parameters (for ``tests/test_distributed.py``).

Same command line as ``fairseq-train``. Under torchrun only rank 0 writes checkpoints; here every process also
writes its model's and criterion's state dicts to ``SAVE_DIR/rank{R}.pt`` whenever fairseq saves (each epoch and at
the end, ``--no-save`` included), so the last write holds the rank's parameters and buffers after the last update.
"""
import os

import torch
from fairseq_cli import train  # first: it sets up fairseq's log format before fairseq is imported

checkpoint_utils = train.checkpoint_utils
_save_checkpoint = checkpoint_utils.save_checkpoint


def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
    """fairseq's ``save_checkpoint``, then this rank's state to ``cfg.save_dir/rank{R}.pt``."""
    result = _save_checkpoint(cfg, trainer, epoch_itr, val_loss)
    os.makedirs(cfg.save_dir, exist_ok=True)
    state = {"model": trainer.get_model().state_dict(), "criterion": trainer.get_criterion().state_dict()}
    torch.save(state, os.path.join(cfg.save_dir, f"rank{trainer.data_parallel_rank}.pt"))
    return result


if __name__ == "__main__":
    # fairseq_cli.train calls checkpoint_utils.save_checkpoint through the module, which keeps its "best" score
    # on the function object it finds there: both see this wrapper.
    checkpoint_utils.save_checkpoint = save_checkpoint
    train.cli_main()
