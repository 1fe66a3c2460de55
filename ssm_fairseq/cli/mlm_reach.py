"""How far a masked LM's first token sees (``ssm-mlm-reach``): the change of its final features when a span of
tokens at distance ``d`` is replaced by other tokens.

``sentence_prediction`` classifies a document from the features of its first token (``<s>``), so a label whose
evidence lies anywhere in a long document needs that token to respond to text far from it. A sliding-window
encoder of ``n`` layers with ``w`` keys each side cannot respond beyond ``n x w`` tokens; an SSM encoder can, as
strongly as its kernels' decay allows. For every block of a split (the checkpoint's ``masked_lm`` blocks, with the
original tokens at the masked positions) and every distance ``d`` of ``--distances`` that fits in the block, the
``--span`` tokens from position ``d`` are replaced by tokens drawn from the same block (seeded), and the table
gives, per checkpoint, the mean over blocks of ``|h'_0 - h_0| / |h_0|`` (``h_0``: the first token's final
features, what a classification head reads). A distance that fits no block is reported as such, not scored.

    ssm-mlm-reach DATA_BIN --checkpoint mssm=ckpt/mssm/checkpoint_best.pt \\
        --checkpoint local=ckpt/local/checkpoint_best.pt --split test --distances 1 128 256 512 1024 2048
"""
from __future__ import annotations

import logging

import torch

from .bucketed_perplexity import named_checkpoints
from .mlm_evidence_perplexity import batches, checkpoints_parser, load

logger = logging.getLogger("mlm_reach")


def original_blocks(task, split: str) -> list[torch.Tensor]:
    """The split's blocks (``L`` tokens each, padding removed) with the original token at every masked position."""
    pad = task.source_dictionary.pad()
    blocks = []
    for sample in batches(task, split, batch_size=1):
        tokens, targets = sample["net_input"]["src_tokens"][0], sample["target"][0]
        tokens = torch.where(targets.ne(pad), targets, tokens)
        blocks.append(tokens[tokens.ne(pad)])
    if not blocks:
        raise ValueError(f"{split}: no blocks")
    return blocks


@torch.no_grad()
def first_token_change(model, blocks: list[torch.Tensor], distances: list[int], span: int,
                       seed: int) -> dict[int, tuple[float, int]]:
    """``distance -> (mean relative change of the first token's features, blocks measured)``; a distance that
    fits no block (``distance + span > L``) maps to ``(nan, 0)``. The replacement tokens are drawn from the
    block's own tokens (the text's frequencies, no symbol it never holds)."""
    generator = torch.Generator().manual_seed(seed)
    totals = {d: [0.0, 0] for d in distances}
    for block in blocks:
        first = model(block[None], features_only=True)[0][0, 0]
        for d in distances:
            if d + span > len(block):
                continue
            changed = block.clone()
            changed[d:d + span] = block[torch.randint(len(block), (span,), generator=generator)]
            moved = model(changed[None], features_only=True)[0][0, 0]
            totals[d][0] += ((moved - first).norm() / first.norm()).item()
            totals[d][1] += 1
    return {d: (total / count if count else float("nan"), count) for d, (total, count) in totals.items()}


def table(rows: list[tuple[str, dict[int, tuple[float, int]]]], span: int, split: str) -> str:
    """Markdown: a row per checkpoint, a column per distance (blocks measured in the header)."""
    counts = {d: count for d, (_, count) in rows[0][1].items()}
    header = " | ".join(f"d = {d} ({counts[d]} blocks)" for d in counts)
    lines = [f"| {split}: first token's change, {span} tokens replaced at distance d | {header} |",
             "|---" * (len(counts) + 1) + "|"]
    for name, changes in rows:
        cells = " | ".join(f"{mean:.3g}" if count else "no block that long" for mean, count in changes.values())
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = checkpoints_parser(__doc__.split("\n")[0])
    parser.add_argument("--distances", type=int, nargs="+", default=[1, 64, 128, 256, 512, 1024, 2048],
                        help="positions where the replaced span starts (position 0 is the first token)")
    parser.add_argument("--span", type=int, default=16, help="tokens replaced")
    parser.add_argument("--seed", type=int, default=1, help="seed of the masks and of the replacement tokens")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    if args.span < 1 or min(args.distances) < 1:
        parser.error("--span and every distance must be positive (position 0 is the token measured)")
    named = named_checkpoints(parser, args.checkpoint)
    import ssm_fairseq  # noqa: F401  (registers the models with fairseq)

    rows = []
    for name, paths in named.items():
        model, task, _ = load(paths[0], args.data_bin, args.seed)
        logger.info("measuring %s on %s", name, args.split)
        rows.append((name, first_token_change(model, original_blocks(task, args.split), args.distances, args.span,
                                              args.seed)))
    if not any(count for _, changes in rows for _, count in changes.values()):
        raise SystemExit(f"no block of {args.split} is longer than the shortest distance plus --span: nothing measured")
    print(table(rows, args.span, args.split))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
