"""Where a seq2seq model's cross-attention looks (``ssm-seq2seq-attention``): the share of each decoder layer's
cross-attention, per head, that lands on the source positions holding the token being predicted.

For a task whose output tokens are copied from the source (the seq2seq recipe's far-ordering task: the two marker
words in source order), a model that has learned it looks up those tokens: at the step that predicts target token
``t``, its cross-attention weighs the source positions holding ``t``. A model at the targets' marginal distribution
has not: its attention is spread over the whole source, each copy getting its uniform share. For every example of a
split (teacher-forced, the reference target as the decoder's input) and every target position up to
``--positions`` whose token occurs in the source, the table gives the mean of that share per decoder layer and
head, beside the share uniform attention would give. A position whose token is in no source is reported as such.

    ssm-seq2seq-attention DATA_BIN --path checkpoints/spade_t5_small/finetune/checkpoint_best.pt --split test
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from ..modules.cross_attention import CrossAttention

logger = logging.getLogger("seq2seq_attention")


def load(path: Path, data_bin: Path):
    """A seq2seq checkpoint (eval mode, CPU) with ``data_bin``'s data and its ``translation`` task."""
    from fairseq import checkpoint_utils

    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)],
                                                                      arg_overrides={"data": str(data_bin)})
    if cfg.task._name != "translation":
        raise ValueError(f"{path}: a checkpoint of task {cfg.task._name}, not translation")
    return models[0].eval(), task


@torch.no_grad()
def attention_on_copies(model, dataset, positions: int) -> tuple[list[list[torch.Tensor]], list[float], list[int]]:
    """``(shares, uniform, counts)``: ``shares[p][layer]`` (``heads``) the mean share of target position ``p``'s
    cross-attention on the source positions holding its reference token, ``uniform[p]`` what attention spread
    evenly would give, ``counts[p]`` the examples whose source holds that token (the others are not scored)."""
    layers = [module for module in model.decoder.modules() if isinstance(module, CrossAttention)]
    if not layers:
        raise ValueError("the model has no cross-attention")
    for layer in layers:
        layer.keep_weights = True
    totals = [[0.0] * len(layers) for _ in range(positions)]
    uniform, counts = [0.0] * positions, [0] * positions
    eos = model.decoder.dictionary.eos()
    try:
        for index in range(len(dataset)):
            item = dataset[index]
            source, target = item["source"], item["target"]
            previous = torch.cat([target.new_tensor([eos]), target[:-1]])
            model(source[None], torch.tensor([len(source)]), previous[None])
            for p in range(min(positions, len(target))):
                copies = source.eq(target[p])
                if not copies.any():
                    continue
                for n, layer in enumerate(layers):
                    totals[p][n] = totals[p][n] + layer.last_weights[0, :, p, copies].sum(-1)
                uniform[p] += copies.float().mean().item()
                counts[p] += 1
    finally:
        for layer in layers:
            layer.keep_weights, layer.last_weights = False, None
    shares = [[total / counts[p] if counts[p] else None for total in totals[p]] for p in range(positions)]
    return shares, [u / c if c else float("nan") for u, c in zip(uniform, counts)], counts


def table(shares, uniform: list[float], counts: list[int], split: str) -> str:
    """Markdown: a row per decoder layer, a column per target position (its examples and uniform share in the
    header), the heads' shares in each cell."""
    header = " | ".join(f"target token {p + 1}: {counts[p]} examples, uniform {uniform[p]:.3f}" if counts[p]
                        else f"target token {p + 1}: in no source" for p in range(len(counts)))
    lines = [f"| {split}: cross-attention on the copies of the token predicted, per head | {header} |",
             "|---" * (len(counts) + 1) + "|"]
    for n in range(len(shares[0])):
        cells = " | ".join(" ".join(f"{x:.3f}" for x in shares[p][n].tolist()) if counts[p] else "-"
                           for p in range(len(counts)))
        lines.append(f"| decoder layer {n + 1} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_bin", type=Path, help="fairseq-preprocess output of the translation pairs")
    parser.add_argument("--path", type=Path, required=True, help="a spade_transformer checkpoint")
    parser.add_argument("--split", default="test")
    parser.add_argument("--positions", type=int, default=2, help="target tokens measured, from the first")
    args = parser.parse_args(argv)
    if args.positions < 1:
        parser.error(f"--positions must be at least 1, got {args.positions}")
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    import ssm_fairseq  # noqa: F401  (registers the models with fairseq)

    model, task = load(args.path, args.data_bin)
    task.load_dataset(args.split, combine=False, epoch=1)
    logger.info("teacher-forcing the %d examples of %s", len(task.dataset(args.split)), args.split)
    shares, uniform, counts = attention_on_copies(model, task.dataset(args.split), args.positions)
    if not any(counts):
        raise SystemExit(f"{args.split}: no target token among the first {args.positions} occurs in its source: "
                         f"nothing measured")
    print(table(shares, uniform, counts, args.split))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
