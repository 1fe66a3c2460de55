"""Shared setup for SPADE LM tests: build architectures through fairseq's option parsing and registries."""
from __future__ import annotations

from fairseq import models, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import ssm_fairseq  # noqa: F401  (registers the models)

SMALL = ("--decoder-layers", "3", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
         "--decoder-attention-heads", "4", "--attention-window", "8", "--ssm-state-size", "8", "--dropout", "0",
         "--global-layers", "2")


class Task:
    """The part of a fairseq language-modelling task the model uses: its dictionary."""

    def __init__(self, vocab_size: int = 30):
        self.source_dictionary = self.target_dictionary = self.dictionary = Dictionary()  # lstm_lm reads .dictionary
        for i in range(vocab_size - len(self.source_dictionary)):
            self.source_dictionary.add_symbol(f"w{i}")


def build(arch: str, *overrides: str, tokens_per_sample: int = 256, vocab_size: int = 30):
    """``(model, cfg, task)`` as ``fairseq-train --task language_modeling`` builds them."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["data", "--task", "language_modeling", "--arch", arch, "--tokens-per-sample",
                 str(tokens_per_sample), "--optimizer", "adam", "--lr", "1e-3", "--cpu", *overrides],
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = Task(vocab_size)
    return models.build_model(cfg.model, task), cfg, task
