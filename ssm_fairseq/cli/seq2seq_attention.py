"""Where a seq2seq model's cross-attention looks (``ssm-seq2seq-attention``): the share of each decoder layer's
cross-attention, per head, that lands on the source positions holding the token being predicted, and how much the
encoder's output, which cross-attention reads, tells the source's pieces apart.

For a task whose output tokens are copied from the source (the seq2seq recipe's far-ordering task: the two marker
words in source order), a model that has learned it looks up those tokens: at the step that predicts target token
``t``, its cross-attention weighs the source positions holding ``t``. A model at the targets' marginal distribution
has not: its attention is spread over the whole source, each copy getting its uniform share. For every example of a
split (teacher-forced, the reference target as the decoder's input) and every target position up to
``--positions`` whose token occurs in the source, the first table gives the mean of that share per decoder layer
and head, beside the share uniform attention would give. A position whose token is in no source is reported as
such. The second table gives the encoder's output over the split's sources: the mean norm of a position's
encoding, the mean distance between the mean encodings of two different pieces, and the mean distance of an
encoding from its piece's mean (what its context adds). When both distances are small against the norm, the
encoder gives about the same vector everywhere and there is nothing for cross-attention to look up.

Any ``spade_transformer`` checkpoint whose dictionary is the pairs' (fine-tuned, or pre-trained with the denoising
task on the same dictionary) is measured on ``DATA_BIN``'s translation pairs; ``--untrained`` measures the same
configuration with fresh weights (what training starts from).

    ssm-seq2seq-attention DATA_BIN --path checkpoints/spade_t5_small/finetune/checkpoint_best.pt --split test
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from ..layers.attention.cross_attention import CrossAttention

logger = logging.getLogger("seq2seq_attention")


def load(path: Path, data_bin: Path, untrained: bool = False):
    """A seq2seq checkpoint's model (eval mode, CPU), built for the ``translation`` task of ``data_bin`` (also a
    checkpoint of another task on the same dictionary), and that task; ``untrained``: fresh weights of the
    checkpoint's configuration."""
    from fairseq import checkpoint_utils
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    # the fields fairseq fills from its dataset options, given as fairseq-train's defaults
    task = TranslationTask.setup_task(TranslationConfig(data=str(data_bin), train_subset="train", dataset_impl=None,
                                                        required_seq_len_multiple=1))
    if untrained:
        model = task.build_model(checkpoint_utils.load_checkpoint_to_cpu(str(path))["cfg"].model)
    else:
        model = checkpoint_utils.load_model_ensemble([str(path)], task=task)[0][0]
    return model.eval(), task


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


@torch.no_grad()
def encoder_spread(model, dataset) -> tuple[float, float, float]:
    """``(norm, between, within)`` of the encoder's output over ``dataset``'s sources: the mean norm of a position's
    encoding, the mean distance between the mean encodings of two different pieces (over the pieces that occur),
    and the mean distance of a position's encoding from its piece's mean."""
    encodings, pieces = [], []
    for index in range(len(dataset)):
        source = dataset[index]["source"]
        out = model.encoder(source[None], torch.tensor([len(source)]))["encoder_out"][0]  # L x 1 x D
        encodings.append(out[:, 0])
        pieces.append(source)
    x, piece = torch.cat(encodings), torch.cat(pieces)
    kinds, which = piece.unique(return_inverse=True)
    if len(kinds) < 2:
        raise ValueError("the sources hold fewer than two different pieces: no distance between pieces to measure")
    means = torch.zeros(len(kinds), x.shape[1]).index_add_(0, which, x) / torch.bincount(which)[:, None]
    between = torch.cdist(means, means).sum() / (len(kinds) * (len(kinds) - 1))
    within = (x - means[which]).norm(dim=-1).mean()
    return x.norm(dim=-1).mean().item(), between.item(), within.item()


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
    parser.add_argument("--untrained", action="store_true", help="fresh weights of the checkpoint's configuration "
                                                                 "(made with --seed) instead of its own")
    parser.add_argument("--seed", type=int, default=1, help="the fresh weights' seed (with --untrained)")
    args = parser.parse_args(argv)
    if args.positions < 1:
        parser.error(f"--positions must be at least 1, got {args.positions}")
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    import ssm_fairseq  # noqa: F401  (registers the models with fairseq)

    torch.manual_seed(args.seed)
    model, task = load(args.path, args.data_bin, args.untrained)
    task.load_dataset(args.split, combine=False, epoch=1)
    dataset = task.dataset(args.split)
    logger.info("teacher-forcing the %d examples of %s (%s)", len(dataset), args.split,
                f"untrained, seed {args.seed}" if args.untrained else "trained weights")
    shares, uniform, counts = attention_on_copies(model, dataset, args.positions)
    if not any(counts):
        raise SystemExit(f"{args.split}: no target token among the first {args.positions} occurs in its source: "
                         f"nothing measured")
    print(table(shares, uniform, counts, args.split))
    norm, between, within = encoder_spread(model, dataset)
    print(f"\n| {args.split}: the encoder's output, {len(dataset)} sources | norm | between two pieces' mean encodings "
          f"| from its piece's mean |\n|---|---|---|---|\n| last encoder layer | {norm:.2f} | {between:.2f} | "
          f"{within:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
