#!/usr/bin/env python
"""Cost of a chunk over a long stream, end to end: the streaming recognizer against a cached causal transformer.

    flock /tmp/cpu.lock python scripts/benchmarks/streaming_cost.py --minutes 60

One live stream of ``--minutes`` (default 60) of audio, made of a subset's utterances (default test-mini of the
mini corpus, cycled in order) each followed by ``--pause-seconds`` (default 1) of faint noise (a 16-bit
recording's floor), is cut into ``--chunk-ms`` chunks (default 320 ms), made as they are consumed (the whole
recording is never held), and goes chunk by chunk through:

* ``recognizer``: a real ``Stream`` on ``--checkpoint`` (default the mini recipe's streaming model,
  ``/work/models/mini_streaming``), with endpoints (``EndpointRules()``: the search, its LM context and the partial
  transcript restart at each) and word timestamps, beam ``--beam`` (``--search exact`` or ``modified``):
  ``accept_waveform`` whole, and its parts: ``features`` (filterbank and transforms, ``Stream.take_samples``),
  ``encoder`` (the causal encoder's step, ``Recognizer.encode_features``), ``search`` (the search over the chunk's
  encoder frames, the endpoint rules and each ended segment's final transcript and word times,
  ``Stream.search_frames``) and ``text`` (the partial transcript, ``Stream.partial_text``: incremental
  detokenization).
* ``reference``: a causal transformer encoder of the checkpoint's width, depth, FFN width and attention heads
  (random weights: the cost does not depend on them), the same 4-frame sub-sampling (frames stacked and projected),
  pre-LayerNorm layers, no positional encoding, stepped over the same feature frames the recognizer's encoder gets:
  each layer keeps a key/value cache capped at ``--left-context-seconds`` (default 10 s) of encoder frames, so a
  chunk's queries attend to at most that many past frames and their chunk's. An encoder alone: compare it with the
  recognizer's ``encoder`` row (the recognizer's other rows are what a complete recognizer adds).

With ``--lm-path`` (and ``--lm-weight``, and for LODR ``--ilm-path`` / ``--ilm-weight``) the recognizer's search
is fused with that language model. With ``--compare-lm`` too, two recognizers of the same checkpoint stream the
same chunks one after the other, ``plain`` (no LM) and ``fused``: the table has each one's rows, and a second table
sets them side by side (CPU and wall medians per chunk, fused / plain) for the first minute and the last, with the
two streams' transcripts compared (the LM should change some words, and never the encoder's cost).

    flock /tmp/cpu.lock python scripts/benchmarks/streaming_cost.py --minutes 5 --compare-lm \
        --lm-path LM_DIR/checkpoint_best.pt --lm-weight 0.3  # an LM over the checkpoint's dictionary

All run in the same process, chunk after chunk, so that the machine's load hits them alike. The table gives, for
the first minute of the stream and for the last, the median and the mean over its chunks of the wall time and of
the process's CPU time (``time.process_time``; run with ``--threads 1`` for it to be the chunk's own) per chunk,
and their ratio last / first. Below it: the process's peak resident memory (VmHWM) after the first minute and at
the end, and what the stream holds at the end (segments ended, their words). Times are printed, never asserted.
Run alone, under the CPU lock: another busy process slows them all.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import editdistance
import numpy as np
import soundfile as sf
import torch
import torch.nn.functional as F

from measurement import status_kib
from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.endpoints import EndpointRules
from ssm_fairseq.asr.features.audio_features import NUM_MEL_BINS, SAMPLE_RATE

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CHECKPOINT = Path("/work/models/mini_streaming/checkpoints/mssm_transducer_streaming/checkpoint_avg3.pt")
DEFAULT_CORPUS = REPO / "recipes/librispeech/mini/LibriSpeech"
NOISE_FLOOR = 1 / 32768  # one 16-bit step: faint, never digital silence


def long_stream(files: list[Path], minutes: float, pause_seconds: float, chunk: int) -> Iterator[np.ndarray]:
    """``minutes`` of audio in ``chunk``-sample pieces (the last one shorter): the ``files`` cycled, each followed
    by ``pause_seconds`` of noise at the 16-bit floor; made as consumed (one utterance and one chunk held)."""
    utterances = [sf.read(str(path), dtype="float32")[0] for path in files]
    pause = np.random.default_rng(0).normal(0, NOISE_FLOOR, round(pause_seconds * SAMPLE_RATE)).astype(np.float32)
    left = round(minutes * 60 * SAMPLE_RATE)
    pending = np.zeros(0, np.float32)
    for samples in itertools.cycle(utterances):
        pending = np.concatenate([pending, samples, pause])
        while len(pending) >= chunk and left:
            take = min(chunk, left)
            yield pending[:take]
            pending, left = pending[take:], left - take
        if not left:
            return


class CachedCausalTransformer(torch.nn.Module):
    """A causal transformer encoder stepped chunk by chunk with a key/value cache of at most ``left_context``
    encoder frames per layer (the reference of the module docstring).

    ``step(features, cache)``: ``1 x n x 80`` feature frames (``n`` a multiple of ``stride``) -> ``1 x n/stride x
    width`` encoder frames; ``cache``: a list, empty at the stream's start, that holds each layer's ``(keys,
    values)``, ``1 x heads x L x width/heads`` with ``L <= left_context``."""

    def __init__(self, width: int, layers: int, ffn: int, heads: int, left_context: int, stride: int = 4):
        super().__init__()
        self.heads, self.left_context, self.stride = heads, left_context, stride
        self.subsample = torch.nn.Linear(NUM_MEL_BINS * stride, width)
        self.layers = torch.nn.ModuleList(torch.nn.ModuleDict({
            "attention_norm": torch.nn.LayerNorm(width), "qkv": torch.nn.Linear(width, 3 * width),
            "out": torch.nn.Linear(width, width), "ffn_norm": torch.nn.LayerNorm(width),
            "ffn_in": torch.nn.Linear(width, ffn), "ffn_out": torch.nn.Linear(ffn, width)}) for _ in range(layers))

    @torch.no_grad()
    def step(self, features: torch.Tensor, cache: list) -> torch.Tensor:
        batch, n, _ = features.shape
        x = self.subsample(features.reshape(batch, n // self.stride, -1))
        m = x.shape[1]
        for index, layer in enumerate(self.layers):
            q, k, v = layer["qkv"](layer["attention_norm"](x)).reshape(batch, m, 3, self.heads, -1).permute(
                2, 0, 3, 1, 4)
            if index < len(cache):
                k, v = torch.cat([cache[index][0], k], 2), torch.cat([cache[index][1], v], 2)
            past = k.shape[2] - m
            # query i (of the chunk's m) sees the cached frames and the chunk's up to itself
            mask = torch.arange(k.shape[2]).unsqueeze(0) <= past + torch.arange(m).unsqueeze(1)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + layer["out"](attended.transpose(1, 2).reshape(batch, m, -1))
            x = x + layer["ffn_out"](F.gelu(layer["ffn_in"](layer["ffn_norm"](x))))
            kept = (k[:, :, -self.left_context:], v[:, :, -self.left_context:])
            if index < len(cache):
                cache[index] = kept
            else:
                cache.append(kept)
        return x


class Clock:
    """Wall and process CPU seconds of each call of wrapped functions, summed per part until ``take``."""

    def __init__(self):
        self.spent: dict[str, list[float]] = {}

    def wrap(self, part: str, function: Callable) -> Callable:
        def timed(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent = self.spent.setdefault(part, [0.0, 0.0])
                spent[0] += time.perf_counter() - wall
                spent[1] += time.process_time() - cpu
        return timed

    def take(self) -> dict[str, tuple[float, float]]:
        spent, self.spent = self.spent, {}
        return {part: (wall, cpu) for part, (wall, cpu) in spent.items()}


PARTS = ["recognizer", "features", "encoder", "search", "text", "reference"]
STREAM_PARTS = PARTS[:-1]
LABELS = {"recognizer": "recognizer, end to end (accept_waveform)", "features": "  features",
          "encoder": "  encoder (MSSM, state carried)", "search": "  search, endpoints, segments' words",
          "text": "  text (partial transcript)"}


def fusion_options(args: argparse.Namespace) -> dict:
    """The recognizer options of ``--lm-path`` / ``--lm-weight`` / ``--ilm-path`` / ``--ilm-weight`` (none without
    ``--lm-path``)."""
    if args.lm_path is None:
        return {}
    options = {"lm_path": args.lm_path, "lm_weight": args.lm_weight}
    if args.ilm_path is not None:
        options.update(ilm_path=args.ilm_path, ilm_weight=args.ilm_weight)
    return options


def streams_to_run(args: argparse.Namespace) -> dict[str, dict]:
    """Name -> the recognizer options of each stream measured: one (named ``""``), or ``plain`` and ``fused``."""
    if args.compare_lm:
        return {"plain": {}, "fused": fusion_options(args)}
    return {"": fusion_options(args)}


def instrument(recognizer: Recognizer, stream, clock: Clock, name: str, encoder_input: list[np.ndarray]
               ) -> Callable:
    """Time ``stream``'s parts into ``clock`` under ``name`` (``part`` or ``name:part``) and keep the feature
    frames its encoder takes in ``encoder_input`` -> the timed ``accept_waveform``."""
    key = (lambda part: f"{name}:{part}") if name else (lambda part: part)
    encode_features = clock.wrap(key("encoder"), recognizer.encode_features)

    def encode(features: np.ndarray, cache: dict, final: bool) -> torch.Tensor:
        encoder_input.append(features)
        return encode_features(features, cache, final)
    recognizer.encode_features = encode
    for part, method in (("features", "take_samples"), ("search", "search_frames"), ("text", "partial_text")):
        setattr(stream, method, clock.wrap(key(part), getattr(stream, method)))
    return clock.wrap(key("recognizer"), stream.accept_waveform)


def run(args: argparse.Namespace) -> tuple[list[dict], list[dict], dict]:
    """The stream through each recognizer and the reference -> per chunk ``{part: (wall, cpu)}`` (``name:part`` with
    ``--compare-lm``) of the first minute and of the last (only those are kept, so that the benchmark's own records
    do not grow with the stream), and memory and stream facts (per stream name)."""
    files = sorted((args.corpus_root / args.subset).glob("*/*/*.flac"))
    if not files:
        sys.exit(f"{args.corpus_root / args.subset}: no .flac files")
    clock = Clock()
    encoder_inputs: dict[str, list[np.ndarray]] = {}
    streams, accepts = {}, {}
    for name, options in streams_to_run(args).items():
        recognizer = Recognizer(args.checkpoint, device=args.device, beam=args.beam, search=args.search, **options)
        streams[name] = recognizer.stream(timestamps=recognizer.tokenizer is None, endpoints=EndpointRules())
        encoder_inputs[name] = []
        accepts[name] = instrument(recognizer, streams[name], clock, name, encoder_inputs[name])
    cfg = recognizer.model.cfg
    left_context = round(args.left_context_seconds / recognizer.frame_seconds)
    torch.manual_seed(0)
    reference = CachedCausalTransformer(cfg.encoder_embed_dim, cfg.encoder_layers, cfg.encoder_ffn_embed_dim,
                                        cfg.encoder_attention_heads, left_context, recognizer.encoder_stride
                                        ).to(args.device).eval()
    reference_cache: list = []
    chunk = round(args.chunk_ms * SAMPLE_RATE / 1000)
    chunks_per_minute = max(1, round(60 * 1000 / args.chunk_ms))
    first: list[dict] = []
    last: collections.deque[dict] = collections.deque(maxlen=chunks_per_minute)
    facts = {}
    step_reference = clock.wrap("reference", _step_reference)
    reference_input = encoder_inputs[next(iter(encoder_inputs))]  # every stream's encoder takes the same frames
    for n, samples in enumerate(long_stream(files, args.minutes, args.pause_seconds, chunk)):
        for name, accept in accepts.items():
            encoder_inputs[name].clear()
            accept(samples)
        step_reference(reference, reference_input, reference_cache, args.device)
        cost = clock.take()
        last.append(cost)
        if n < chunks_per_minute:
            first.append(cost)
        if n + 1 == chunks_per_minute:
            facts["peak after minute 1"] = status_kib("VmHWM") / 1024
    facts["peak at the end"] = status_kib("VmHWM") / 1024
    facts.setdefault("peak after minute 1", facts["peak at the end"])
    for name, stream in streams.items():
        facts[name] = {"segments": [segment.text for segment in stream.segments],
                       "words": sum(len(segment.text.split()) for segment in stream.segments),
                       "text chars": sum(len(segment.text) for segment in stream.segments)}
    facts["reference cache frames"] = reference_cache[0][0].shape[2] if reference_cache else 0
    facts["chunks"] = n + 1
    return first, list(last), facts


def _step_reference(reference: CachedCausalTransformer, encoder_input: list[np.ndarray], cache: list,
                    device: str) -> None:
    """The reference stepped over the feature frames the recognizer's encoder took in this chunk (none: no step)."""
    frames = [features for features in encoder_input if len(features)]
    if frames:
        features = torch.from_numpy(np.concatenate(frames)).to(device).unsqueeze(0)
        reference.step(features[:, :features.shape[1] // reference.stride * reference.stride], cache)


def stats(chunks: list[dict], part: str, what: int) -> tuple[float, float]:
    """Median and mean over ``chunks`` of ``part``'s wall (``what`` 0) or CPU (1) milliseconds."""
    values = [1000 * chunk.get(part, (0.0, 0.0))[what] for chunk in chunks]
    return statistics.median(values), statistics.fmean(values)


def row_label(name: str, part: str) -> str:
    label = LABELS[part]
    indent = label[:len(label) - len(label.lstrip())]
    return f"{indent}{name}: {label.lstrip()}" if name else label


def table(first: list[dict], last: list[dict], facts: dict, args: argparse.Namespace) -> None:
    last_name = f"minute {args.minutes:g}" if facts["chunks"] > len(first) else "minute 1 (the whole stream)"
    print(f"| ms per {args.chunk_ms:g} ms chunk | minute 1 wall median / mean | minute 1 CPU median / mean | "
          f"{last_name} wall median / mean | {last_name} CPU median / mean | last / first (CPU median) |")
    print("|---|---|---|---|---|---|")
    left = f"{args.left_context_seconds:g} s"
    names = list(streams_to_run(args))
    rows = [(f"{name}:{part}" if name else part, row_label(name, part)) for name in names for part in STREAM_PARTS]
    rows.append(("reference", f"reference: causal transformer, key/value cache capped at {left} (encoder only)"))
    for part, label in rows:
        cells = [stats(chunks, part, what) for chunks in (first, last) for what in (0, 1)]
        ratio = cells[3][0] / cells[1][0] if cells[1][0] else float("nan")
        print(f"| {label} | " + " | ".join(f"{median:.2f} / {mean:.2f}" for median, mean in cells)
              + f" | {ratio:.2f}x |")
    if args.compare_lm:
        comparison(first, last, last_name, args)
    peak1, peak = facts["peak after minute 1"], facts["peak at the end"]
    print(f"\nprocess peak resident memory (VmHWM): {peak1:.1f} MiB after minute 1, {peak:.1f} MiB at the end "
          f"({peak / peak1:.3f}x)")
    for name in names:
        held = facts[name]
        print(f"stream{' ' + name if name else ''} at the end: {len(held['segments'])} segments ended, "
              f"{held['words']} words ({held['text chars']} characters) kept segment by segment")
    if args.compare_lm:
        plain, fused = (" ".join(facts[name]["segments"]).split() for name in ("plain", "fused"))
        print(f"fused against plain: {editdistance.eval(plain, fused)} word edits between their transcripts "
              f"({len(plain)} and {len(fused)} words)")
    print(f"reference cache: {facts['reference cache frames']} frames per layer")


def comparison(first: list[dict], last: list[dict], last_name: str, args: argparse.Namespace) -> None:
    """The plain and the fused stream side by side: CPU (wall) medians per chunk and fused / plain."""
    print(f"\n| ms per {args.chunk_ms:g} ms chunk, CPU median (wall median) | minute 1 plain | minute 1 fused | "
          f"fused / plain | {last_name} plain | {last_name} fused | fused / plain |")
    print("|---|---|---|---|---|---|---|")
    for part in STREAM_PARTS:
        cells = []
        for chunks in (first, last):
            (plain_wall, _), (plain_cpu, _), (fused_wall, _), (fused_cpu, _) = (
                stats(chunks, f"{name}:{part}", what) for name in ("plain", "fused") for what in (0, 1))
            ratio = fused_cpu / plain_cpu if plain_cpu else float("nan")
            cells += [f"{plain_cpu:.2f} ({plain_wall:.2f})", f"{fused_cpu:.2f} ({fused_wall:.2f})", f"{ratio:.2f}x"]
        print(f"| {LABELS[part]} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT,
                        help="a causal transducer checkpoint (default: the mini recipe's streaming model)")
    parser.add_argument("--corpus-root", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--subset", default="test-mini", help="whose utterances make the stream")
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the stream (default 60)")
    parser.add_argument("--chunk-ms", type=float, default=320.0)
    parser.add_argument("--pause-seconds", type=float, default=1.0, help="noise after each utterance (default 1)")
    parser.add_argument("--beam", type=int, default=4, help="1: greedy search (default 4, as the recipe decodes)")
    parser.add_argument("--search", choices=("exact", "modified"), default="exact",
                        help="with a beam: exact (several labels per frame, default) or modified (one) beam search")
    parser.add_argument("--left-context-seconds", type=float, default=10.0,
                        help="the reference transformer's key/value cache (default 10 s)")
    parser.add_argument("--lm-path", type=Path, help="a language model to fuse into the search (its dictionary "
                        "must be the checkpoint's data directory's)")
    parser.add_argument("--lm-weight", type=float, default=0.3, help="the LM's weight (default 0.3)")
    parser.add_argument("--ilm-path", type=Path, help="LODR: a bigram of the training transcripts "
                        "(scripts/build_bigram.py) subtracted as the internal LM")
    parser.add_argument("--ilm-weight", type=float, default=0.0, help="the bigram's weight (default 0)")
    parser.add_argument("--compare-lm", action="store_true",
                        help="stream the same chunks through a plain and a fused recognizer, side by side")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU time is the chunk's)")
    args = parser.parse_args(argv)
    if not (args.minutes > 0 and args.chunk_ms > 0 and args.pause_seconds >= 0 and args.left_context_seconds > 0):
        parser.error("--minutes, --chunk-ms and --left-context-seconds must be positive, --pause-seconds >= 0")
    if (args.compare_lm or args.ilm_path is not None) and args.lm_path is None:
        parser.error("--compare-lm and --ilm-path need --lm-path")
    torch.set_num_threads(args.threads)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    fusion = "" if args.lm_path is None else (
        f"; {'plain and fused' if args.compare_lm else 'fused'} with {args.lm_path} at weight {args.lm_weight:g}"
        + ("" if args.ilm_path is None else f", LODR {args.ilm_path} at weight {args.ilm_weight:g}"))
    searching = "greedy search" if args.beam == 1 else f"beam {args.beam}, {args.search} search"
    print(f"# A {args.minutes:g}-minute stream of {args.subset} utterances with {args.pause_seconds:g} s pauses in "
          f"{args.chunk_ms:g} ms chunks: {args.checkpoint}, {searching}{fusion}, endpoints and word timestamps on; "
          f"device {args.device}, {args.threads} thread(s), torch {torch.__version__}; load average {load} at the "
          f"start\n")
    first, last, facts = run(args)
    table(first, last, facts, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
