"""Masked-token perplexity of masked LM checkpoints, split by where the evidence for a masked token lies
(``ssm-mlm-evidence-ppl``).

A sliding-window encoder of ``n`` layers with ``w`` keys on each side sees at most ``n x w`` tokens either way of
a masked position; an MSSM encoder sees the whole sequence. A masked token whose word is also visible elsewhere in
the same sequence can be copied from there, but by the window model only if that occurrence is within its reach.
This script scores a split as ``fairseq-validate --seed N`` does (the checkpoint's ``masked_lm`` task and blocks,
the masks drawn with ``--seed``, default 1, whatever seed the model trained with: the same masked tokens for every
checkpoint and, over all tokens, the same perplexity as ``fairseq-validate`` with that seed) and groups every masked
token by its nearest visible occurrence of the same token in the model's input (masked positions show ``<mask>``
or a random token, not the word):

* **inside**: an occurrence at most ``--reach`` tokens away (default: the first sliding-window model's
  layers x window, the furthest it can look);
* **outside**: occurrences only further away, inside the sequence;
* **none**: no visible occurrence in the sequence.

    ssm-mlm-evidence-ppl DATA_BIN --checkpoint mssm=ckpt/mssm/checkpoint_best.pt \\
        --checkpoint local=ckpt/local/checkpoint_best.pt --split test --ablate-ssm

Besides the models, the table has a ``unigram`` row (training-split token frequencies, add-one smoothed, no
context: what a model that has learned only which tokens are frequent scores), and with ``--ablate-ssm`` a row
below every model with SSM sub-layers with those sub-layers' outputs zeroed
(``ssm_fairseq.layers.state_space.ssm_ablation``).
Prints a markdown table; a checkpoint that does not load, or a split without masked tokens, stops the run.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from .bucketed_perplexity import BucketLoss, named_checkpoints, table_rows

logger = logging.getLogger("mlm_evidence_perplexity")
BUCKETS = ("inside", "outside", "none")


def evidence_buckets(src_tokens: torch.Tensor, targets: torch.Tensor, pad: int, reach: int) -> torch.Tensor:
    """The bucket (index into ``BUCKETS``) of every masked token of a batch.

    ``src_tokens``: ``B x L``, the model's input; ``targets``: ``B x L``, the original token at masked positions
    and ``pad`` elsewhere. Returns ``M`` bucket indices, in the order of ``targets.ne(pad)`` (row-major): 0 when
    the target token is visible in ``src_tokens`` at most ``reach`` positions away (the position itself excluded),
    1 when visible only further away, 2 when not visible in the row.
    """
    masked = targets.ne(pad)
    rows, positions = masked.nonzero(as_tuple=True)
    words = targets[rows, positions]  # M
    shown = src_tokens[rows].eq(words[:, None])  # M x L: where the masked word is visible in its row
    shown[torch.arange(len(rows)), positions] = False
    distance = (torch.arange(src_tokens.shape[1])[None, :] - positions[:, None]).abs()
    nearest = distance.masked_fill(~shown, src_tokens.shape[1]).min(dim=1).values
    buckets = torch.full_like(nearest, 2)
    buckets[nearest < src_tokens.shape[1]] = 1
    buckets[nearest <= reach] = 0
    return buckets


def load(path: Path, data_bin: Path, seed: int):
    """A masked LM checkpoint (eval mode, CPU) with ``data_bin``'s data, its ``masked_lm`` task (masking with
    ``seed``) and its config."""
    from fairseq import checkpoint_utils

    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)],
                                                                      arg_overrides={"data": str(data_bin),
                                                                                     "seed": seed})
    if cfg.task._name != "masked_lm":
        raise ValueError(f"{path}: a checkpoint of task {cfg.task._name}, not masked_lm")
    return models[0].eval(), task, cfg


def batches(task, split: str, batch_size: int):
    """The split's batches as ``fairseq-validate`` makes them (the task's blocks and masks, in order); a block
    longer than the model takes is an error, as there, not skipped."""
    task.load_dataset(split, combine=False, epoch=1)
    dataset = task.dataset(split)
    return task.get_batch_iterator(dataset, max_sentences=batch_size, max_positions=task.max_positions(),
                                   ignore_invalid_inputs=False, required_batch_size_multiple=1,
                                   seed=1).next_epoch_itr(shuffle=False)


@torch.no_grad()
def score(model, task, split: str, reach: int, batch_size: int) -> BucketLoss:
    """Masked-token NLL of ``model`` on ``split``, by evidence bucket."""
    pad = task.source_dictionary.pad()
    loss = BucketLoss(BUCKETS)
    for sample in batches(task, split, batch_size):
        src_tokens, targets = sample["net_input"]["src_tokens"], sample["target"]
        masked = targets.ne(pad)
        if not masked.any():
            continue
        logits, _ = model(src_tokens, masked_tokens=masked)  # M x V
        nll = torch.nn.functional.cross_entropy(logits.float(), targets[masked], reduction="none").double()
        loss.add(nll, evidence_buckets(src_tokens, targets, pad, reach))
    if not loss.count["all"]:
        raise ValueError(f"{split}: no masked token was scored")
    return loss


def unigram(task, split: str, reach: int, batch_size: int, data_bin: Path) -> BucketLoss:
    """The same masked tokens scored by the training split's token frequencies (add-one smoothed, no context)."""
    from fairseq.data import data_utils

    dictionary = task.source_dictionary
    train = data_utils.load_indexed_dataset(str(data_bin / "train"), dictionary)
    if train is None:
        raise FileNotFoundError(f"{data_bin}/train.bin/.idx: no binarised training split for the unigram row")
    counts = torch.ones(len(dictionary), dtype=torch.float64)
    for i in range(len(train)):
        counts += torch.bincount(train[i], minlength=len(dictionary)).double()
    log_probs = counts.log() - counts.sum().log()
    pad = dictionary.pad()
    loss = BucketLoss(BUCKETS)
    for sample in batches(task, split, batch_size):
        src_tokens, targets = sample["net_input"]["src_tokens"], sample["target"]
        masked = targets.ne(pad)
        loss.add(-log_probs[targets[masked]], evidence_buckets(src_tokens, targets, pad, reach))
    return loss


def table(rows: list[tuple[str, int | None, BucketLoss]], reach: int, split: str) -> str:
    """Markdown: a row per ``(name, parameters, loss)``, a perplexity per bucket, counts in the header."""
    counts = rows[0][2].count
    header = (f"| model | parameters | {split}: all masked ({counts['all']}) | evidence inside: same token visible "
              f"<= {reach} tokens away ({counts['inside']}) | outside: only further away ({counts['outside']}) | "
              f"none in the sequence ({counts['none']}) |")
    return "\n".join([header, "|---|---|---|---|---|---|", *table_rows([(n, p, [loss]) for n, p, loss in rows])])


def checkpoints_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of the masked-LM evaluation commands: ``DATA_BIN``, ``--checkpoint NAME=PATH`` (repeated),
    ``--split``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("data_bin", type=Path, help="fairseq-preprocess output of the pre-training text")
    parser.add_argument("--checkpoint", action="append", required=True, metavar="NAME=PATH",
                        help="a masked LM checkpoint and the name of its row (repeat)")
    parser.add_argument("--split", default="test")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = checkpoints_parser(__doc__.split("\n")[0])
    parser.add_argument("--reach", type=int,
                        help="inside/outside boundary in tokens (default: the first sliding-window model's "
                             "layers x window)")
    parser.add_argument("--ablate-ssm", action="store_true",
                        help="also score every model with SSM sub-layers with their outputs zeroed")
    parser.add_argument("--batch-size", type=int, default=2, help="sequences per forward pass")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the masks (fairseq-validate's --seed; the same for every checkpoint)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    if args.batch_size < 1:
        parser.error("--batch-size must be positive")
    named = named_checkpoints(parser, args.checkpoint)
    repeated = [name for name, paths in named.items() if len(paths) > 1]
    if repeated:
        parser.error(f"--checkpoint: one checkpoint per name, '{repeated[0]}' has {len(named[repeated[0]])}")
    import ssm_fairseq  # noqa: F401  (registers the models with fairseq)
    from ssm_fairseq.layers.state_space.ssm_ablation import ssm_outputs_zeroed, ssm_sublayers

    loaded = [(name, *load(paths[0], args.data_bin, args.seed)) for name, paths in named.items()]
    reach = args.reach or next((int(cfg.model.encoder_layers) * int(cfg.model.attention_window)
                                for *_, cfg in loaded if cfg.model.encoder_layer_type == "local"), None)
    if reach is None or reach < 1:
        parser.error("no sliding-window model to take the reach from: give --reach (a positive number)")
    rows = []
    for name, model, task, _ in loaded:
        parameters = sum(p.numel() for p in model.parameters())
        logger.info("scoring %s on %s", name, args.split)
        rows.append((name, parameters, score(model, task, args.split, reach, args.batch_size)))
        if args.ablate_ssm and ssm_sublayers(model):
            logger.info("scoring %s with its SSM outputs zeroed", name)
            with ssm_outputs_zeroed(model):
                rows.append((f"{name}, SSM output zeroed", parameters,
                             score(model, task, args.split, reach, args.batch_size)))
    rows.append(("unigram (training frequencies)", None,
                 unigram(loaded[0][2], args.split, reach, args.batch_size, args.data_bin)))
    print(table(rows, reach, args.split))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
