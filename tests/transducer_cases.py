"""Shared setup for transducer tests: build architectures through fairseq's option parsing and registries."""
from __future__ import annotations

import torch
from fairseq import criterions, models, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import ssm_fairseq  # noqa: F401  (registers the model, architectures and criterion)

ARCHITECTURES = (
    "mssm_transducer",
    "mssm_transducer_streaming",
    "mssm_transducer_large",
    "stateformer_transducer",
    "stateformer_transducer_large",
    "transformer_transducer",
    "conformer_transducer",
    "s4_transducer",
)

# small widths for fast tests; each architecture keeps its layer type, sub-sampler and gating
SMALL = (
    "--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--ssm-state-size", "4",
    "--conv-subsampler-channels", "4", "--predictor-embed-dim", "16", "--predictor-hidden-dim", "16",
    "--predictor-layers", "2", "--joint-dim", "24", "--max-source-positions", "512", "--dropout", "0",
    "--predictor-dropout", "0",
)


class Task:
    """The part of a fairseq task the model and criterion use: the target dictionary."""

    def __init__(self, vocab_size: int):
        self.target_dictionary = Dictionary()
        for i in range(vocab_size - len(self.target_dictionary)):
            self.target_dictionary.add_symbol(f"unit{i}")


def parse(arch: str, *overrides: str):
    """The omegaconf config ``fairseq-train`` would build for these command-line arguments."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        ["data", "--task", "speech_to_text", "--arch", arch, "--criterion", "transducer", "--optimizer", "adam",
         "--lr", "1e-3", "--cpu", *overrides],
    )
    return convert_namespace_to_omegaconf(args)


def build(arch: str, *overrides: str, vocab_size: int = 11):
    """``(model, criterion, cfg, task)`` through fairseq's registries."""
    cfg = parse(arch, *overrides)
    task = Task(vocab_size)
    return models.build_model(cfg.model, task), criterions.build_criterion(cfg.criterion, task), cfg, task


def random_sample(task: Task, frame_lengths: list[int], label_lengths: list[int], feat_dim: int = 80) -> dict:
    """A fairseq speech-to-text style batch of random features and labels (targets end with eos)."""
    d = task.target_dictionary
    B, T, U = len(frame_lengths), max(frame_lengths), max(label_lengths) + 1
    features = torch.zeros(B, T, feat_dim)
    target = torch.full((B, U), d.pad())
    for i, (t, u) in enumerate(zip(frame_lengths, label_lengths)):
        features[i, :t] = torch.randn(t, feat_dim)
        target[i, :u] = torch.randint(d.nspecial, len(d), (u,))
        target[i, u] = d.eos()
    return {
        "id": torch.arange(B),
        "net_input": {"src_tokens": features, "src_lengths": torch.tensor(frame_lengths)},
        "target": target,
        "target_lengths": torch.tensor(label_lengths) + 1,
        "ntokens": sum(label_lengths) + B,
        "nsentences": B,
    }
