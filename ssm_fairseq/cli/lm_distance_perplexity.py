"""Perplexity of language models split by how far back the predicted word last occurred (``ssm-lm-distance-ppl``).

A local-attention layer sees the previous ``w`` tokens; a stack of ``n`` of them at most ``n x w``. A word whose
previous occurrence lies further back than that can be predicted from it only by a long-range mechanism (SPADE's
global SSM layer, or full attention). This command scores a binarised split with each checkpoint and reports the
perplexity of every token, and of the tokens grouped by the distance to the previous occurrence of the same token
in the context the model was given:

    ssm-lm-distance-ppl DATA_BIN --checkpoint spade=ckpt/spade/checkpoint_best.pt \\
        --checkpoint local=ckpt/local/checkpoint_best.pt --tokens-per-sample 512 --reach 32 --ablate-ssm

* **near**: the previous occurrence is at most ``--reach`` tokens back (default: the first local-attention
  model's layers x window, the furthest a local-only stack can see);
* **beyond**: it is further back, inside the context;
* **first**: the token does not occur earlier in the context.

The split is read as ``fairseq-eval-lm --context-window 0 --sample-break-mode none`` reads it: one stream of
tokens (every line ending with ``</s>``) cut into blocks of ``--tokens-per-sample`` targets, each block read as
the stream shifted by one (the token before it, then its own tokens but the last; the stream's first token is
predicted from ``</s>``), so every token is scored once and the overall perplexity equals eval-lm's. ``--only
REGEX`` reports only the tokens whose word matches (``re.fullmatch``; the models still read every token), to follow
one kind of word, such as names. Checkpoints given under one name (the seeds of one model) make one row: each
perplexity's mean (min-max) over them. ``--ablate-ssm`` adds, below every model with SSM sub-layers, a row with the
same weights and those sub-layers' outputs zeroed (``ssm_fairseq.layers.state_space.ssm_ablation``). Prints a markdown
table;
a checkpoint that does not load, or a split without tokens, stops the run.
"""
from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Callable

import torch

from .bucketed_perplexity import BucketLoss, named_checkpoints, table_rows

logger = logging.getLogger("lm_distance_perplexity")
BUCKETS = ("near", "beyond", "first")
SOFTMAX_ELEMENTS = 1 << 24  # most log-probabilities held at once (64 MiB in float32)


def token_stream(data_bin: Path, split: str, dictionary) -> torch.Tensor:
    """The split's tokens as one 1-D stream (each line's tokens and its ``</s>``), as fairseq-preprocess wrote it."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(str(data_bin / split), dictionary)
    if dataset is None:
        raise FileNotFoundError(f"{data_bin / split}.bin/.idx: no binarised split '{split}' (run fairseq-preprocess)")
    stream = torch.cat([dataset[i] for i in range(len(dataset))]) if len(dataset) else torch.empty(0, dtype=torch.long)
    if stream.numel() == 0:
        raise ValueError(f"{data_bin / split}: the split has no tokens")
    return stream


def distance_buckets(stream: torch.Tensor, block: int, reach: int) -> list[str]:
    """The bucket of every token of ``stream`` when it is scored in blocks of ``block`` targets.

    Target ``t`` of the block starting at ``s`` sees the tokens ``s - 1 .. t - 1`` (the first block's ``s - 1`` is
    the ``</s>`` the model reads first, which is not a token of the stream); its bucket is ``near`` when the same
    token last occurred at most ``reach`` positions back among them, ``beyond`` when further back, ``first`` when
    not at all.
    """
    tokens = stream.tolist()
    buckets = []
    for start in range(0, len(tokens), block):
        last_seen: dict[int, int] = {}
        if start > 0:
            last_seen[tokens[start - 1]] = start - 1
        for position in range(start, min(start + block, len(tokens))):
            token = tokens[position]
            previous = last_seen.get(token)
            if previous is None:
                buckets.append("first")
            else:
                buckets.append("near" if position - previous <= reach else "beyond")
            last_seen[token] = position
    return buckets


@torch.no_grad()
def token_nll(model, stream: torch.Tensor, block: int, eos: int, batch_size: int, device: torch.device) -> torch.Tensor:
    """Negative log-likelihood (nats, float64) of every token of ``stream``, scored in blocks of ``block``."""
    shifted = torch.cat([stream.new_tensor([eos]), stream[:-1]])
    nll = torch.empty(stream.numel(), dtype=torch.float64)
    starts = list(range(0, stream.numel(), block))
    full = [s for s in starts if s + block <= stream.numel()]
    batches = [full[i:i + batch_size] for i in range(0, len(full), batch_size)]
    batches += [[s] for s in starts if s + block > stream.numel()]  # the last, shorter block
    for done, batch in enumerate(batches, 1):
        length = min(block, stream.numel() - batch[0])
        source = torch.stack([shifted[s:s + length] for s in batch]).to(device)
        target = torch.stack([stream[s:s + length] for s in batch]).to(device)
        features, _ = model(source, features_only=True)
        # the output layer and softmax a few positions at a time: B x L x V log-probabilities at once would be
        # gigabytes for WikiText-103's 267k words (what fairseq-eval-lm's --softmax-batch avoids)
        step = max(1, SOFTMAX_ELEMENTS // (len(batch) * len(model.decoder.dictionary)))
        scores = torch.cat([
            -model.get_normalized_probs((model.decoder.output_layer(features[:, a:a + step]), None), log_probs=True,
                                        sample={"target": target[:, a:a + step]})
            .float().gather(-1, target[:, a:a + step, None]).squeeze(-1)
            for a in range(0, length, step)
        ], dim=1).double().cpu()
        for row, s in enumerate(batch):
            nll[s:s + length] = scores[row]
        if done % 20 == 0 or done == len(batches):
            logger.info("scored %d of %d batches", done, len(batches))
    return nll


def local_reach(model_cfg) -> int | None:
    """``layers x window`` of a model configuration with local attention (``spade_lm``), None for other models."""
    window = getattr(model_cfg, "attention_window", None)
    return None if window is None else int(model_cfg.decoder_layers) * int(window)


def load(path: Path, data_bin: Path, device: torch.device):
    """A language model checkpoint with ``data_bin``'s dictionary, in eval mode on ``device``; its task and its
    model configuration."""
    from fairseq import checkpoint_utils

    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)],
                                                                      arg_overrides={"data": str(data_bin)})
    model = models[0]
    model.prepare_for_inference_(cfg)
    return model.to(device), task, cfg.model


def table(rows: list[tuple[str, int, list[BucketLoss]]], reach: int, block: int, only: str | None = None) -> str:
    """The markdown table of the rows ``(model, parameters, losses of each of its checkpoints)``: a perplexity per
    cell, or its mean (min-max) over the checkpoints of a row; ``only``: the pattern the scored words matched."""
    counts = rows[0][2][0].count
    scored = "tokens" if only is None else f"tokens matching {only}"
    header = (f"| model | parameters | all ({counts['all']} {scored}) | near: last seen <= {reach} tokens back "
              f"({counts['near']}) | beyond: last seen > {reach} back ({counts['beyond']}) | first in its "
              f"{block}-token block ({counts['first']}) |")
    return "\n".join([header, "|---|---|---|---|---|---|", *table_rows(rows)])


def argument_parser() -> argparse.ArgumentParser:
    """``ssm-lm-distance-ppl``'s options (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_bin", type=Path, help="fairseq-preprocess output (dict.txt and the split)")
    parser.add_argument("--checkpoint", action="append", required=True, metavar="NAME=PATH",
                        help="a model to score and the name of its row (repeat; one name for several seeds)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--tokens-per-sample", type=int, required=True, help="targets per block (the training length)")
    parser.add_argument("--reach", type=int, help="near/beyond boundary in tokens (default: the first local-attention "
                        "model's layers x window)")
    parser.add_argument("--ablate-ssm", action="store_true",
                        help="also score every model with SSM sub-layers with their outputs zeroed")
    parser.add_argument("--only", metavar="REGEX", help="report only the tokens whose word matches (re.fullmatch)")
    parser.add_argument("--batch-size", type=int, default=8, help="blocks per forward pass")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser


def load_all(parser: argparse.ArgumentParser, named: dict[str, list[Path]], data_bin: Path, tokens_per_sample: int,
             device: torch.device) -> dict[str, list[tuple]]:
    """Every checkpoint of every name, loaded (``load``: model, task, model configuration); ``parser.error`` for a
    model that takes fewer positions than ``tokens_per_sample``."""
    loaded = {name: [load(path, data_bin, device) for path in paths] for name, paths in named.items()}
    for name, runs in loaded.items():
        for path, (model, _, _) in zip(named[name], runs):
            if tokens_per_sample > model.max_positions():
                parser.error(f"--tokens-per-sample {tokens_per_sample} is longer than {path} takes "
                             f"({model.max_positions()} tokens, its training --tokens-per-sample)")
    return loaded


def selected_tokens(parser: argparse.ArgumentParser, only: str | None, stream: torch.Tensor, dictionary,
                    split: Path) -> list[bool]:
    """Whether each token of ``stream`` is reported: every token, or with ``--only`` those whose word matches it
    (``parser.error`` for a pattern that does not compile or matches no token of ``split``)."""
    if only is None:
        return [True] * stream.numel()
    try:
        pattern = re.compile(only)
    except re.error as error:
        parser.error(f"--only {only!r}: {error}")
    selected = [pattern.fullmatch(dictionary[token]) is not None for token in stream.tolist()]
    if not any(selected):
        parser.error(f"--only {only!r}: no token of {split} matches")
    return selected


def score_rows(loaded: dict[str, list[tuple]], bucket_loss: Callable[[torch.nn.Module], BucketLoss],
               ablate_ssm: bool) -> list[tuple[str, int, list[BucketLoss]]]:
    """The table's rows: each name's parameters and the ``bucket_loss`` of each of its checkpoints, and with
    ``ablate_ssm`` below each model with SSM sub-layers a row of the same checkpoints with their outputs zeroed.
    ``ValueError`` for checkpoints of one name that differ in size."""
    from ssm_fairseq.layers.state_space.ssm_ablation import ssm_outputs_zeroed, ssm_sublayers

    rows = []
    for name, runs in loaded.items():
        parameters = {sum(p.numel() for p in model.parameters()) for model, _, _ in runs}
        if len(parameters) > 1:
            raise ValueError(f"{name}: its checkpoints differ in size ({sorted(parameters)} parameters)")
        logger.info("scoring %s (%d checkpoint(s))", name, len(runs))
        rows.append((name, parameters.pop(), [bucket_loss(model) for model, _, _ in runs]))
        if ablate_ssm and not ssm_sublayers(runs[0][0]):
            logger.info("%s has no SSM sub-layer: no ablation row", name)
        elif ablate_ssm:
            logger.info("scoring %s with its SSM outputs zeroed", name)
            ablated = []
            for model, _, _ in runs:
                with ssm_outputs_zeroed(model):
                    ablated.append(bucket_loss(model))
            rows.append((f"{name}, SSM output zeroed", rows[-1][1], ablated))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    if args.tokens_per_sample < 1 or args.batch_size < 1:
        parser.error("--tokens-per-sample and --batch-size must be positive")
    named = named_checkpoints(parser, args.checkpoint)
    import ssm_fairseq  # noqa: F401  (registers the models with fairseq)

    device = torch.device(args.device)
    loaded = load_all(parser, named, args.data_bin, args.tokens_per_sample, device)
    first = [runs[0] for runs in loaded.values()]
    reach = args.reach or next((r for r in (local_reach(c) for *_, c in first) if r is not None), None)
    if reach is None or reach < 1:
        parser.error("no model has local attention to take the reach from: give --reach (a positive number)")
    dictionary = first[0][1].source_dictionary  # every model's: data_bin's dict.txt
    stream = token_stream(args.data_bin, args.split, dictionary)
    buckets = distance_buckets(stream, args.tokens_per_sample, reach)
    selected = selected_tokens(parser, args.only, stream, dictionary, args.data_bin / args.split)
    indices = torch.tensor([BUCKETS.index(bucket) for bucket in buckets])
    kept = torch.tensor(selected)

    def bucket_loss(model) -> BucketLoss:
        loss = BucketLoss(BUCKETS)
        nll = token_nll(model, stream, args.tokens_per_sample, dictionary.eos(), args.batch_size, device)
        loss.add(nll.cpu()[kept], indices[kept])
        return loss

    print(table(score_rows(loaded, bucket_loss, args.ablate_ssm), reach, args.tokens_per_sample, args.only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
