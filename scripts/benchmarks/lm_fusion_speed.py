#!/usr/bin/env python
"""What language-model fusion costs: each search with and without the LM, offline (batched) and streaming.

Offline: every utterance of ``--subset`` decoded (encoder + search) as ``fairseq-generate`` batches them
(``--max-tokens`` frames a batch), with ``TransducerGenerator`` at greedy, beam 4 and modified beam 4 (one label per
frame), each without and with the LM of ``--lm-path`` at ``--lm-weight``: real-time factor, the fused run's time over
the plain one's, LM calls (steps of the LM's decoder in one pass over the subset), peak memory and WER.

Streaming (a causal checkpoint only): each utterance alone, its features in ``--chunk-ms`` chunks through the
encoder's ``step`` and a search that keeps its hypotheses between chunks (``TransducerGenerator.search``, as
``ssm_fairseq.asr.stream`` runs them): milliseconds per chunk (encoder and search) without and with the LM, over the
first ``--stream-utterances`` utterances.

Each search runs in a fresh process, its plain and fused passes interleaved (one of each, ``--repeats`` times, after a
warm-up of each), so that a machine busy with something else slows both alike; the times are the medians of those
passes, the ratio theirs. Beside the wall-clock ratio, the ratio of the process's CPU time (``time.process_time``):
on a machine loaded by other work it moves less than wall time (with ``--threads 1`` it counts only this work).
Peak memory is measured in a fresh process per search and kind (``measurement.py``). Run it under
``flock /tmp/cpu.lock`` on a shared machine. To compare two versions of the search, ``--baseline ROOT`` (a checkout,
e.g. ``git worktree add /tmp/base HEAD``) measures each search with ``ROOT``'s ``ssm_fairseq`` too, in a child
started just before this checkout's (this script, ``PYTHONPATH=ROOT``): it uses only ``TransducerGenerator``, the
encoder and ``load_language_model``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from decoding import DEFAULT_CHECKPOINT, DEFAULT_DATA, LENGTH_NORM, _single, load, word_error_rate, \
    words_and_references
from measurement import add_measurement_arguments, child, measure

import ssm_fairseq  # noqa: F401  (registers the task and model)
from ssm_fairseq.asr.search import TransducerGenerator
from ssm_fairseq.asr.search.hypothesis import MAX_SYMBOLS_PER_FRAME
from ssm_fairseq.integrity.language_model_check import load_language_model

SEARCHES = [("greedy", 1, MAX_SYMBOLS_PER_FRAME), ("beam 4", 4, MAX_SYMBOLS_PER_FRAME), ("modified beam 4", 4, 1)]
FEATURE_FRAMES_PER_SECOND = 100  # 10 ms filterbank frames


class CallCounter:
    """Counts the calls of a language model's decoder (its incremental steps: ``forward``, and ``step_rows`` of a
    decoder whose rows a token store keeps, ``spade_lm``'s)."""

    def __init__(self, lm):
        self.calls = 0
        for name in ("forward", "step_rows"):
            if hasattr(lm.decoder, name):
                setattr(lm.decoder, name, self._counted(getattr(lm.decoder, name)))

    def _counted(self, method):
        def counted(*args, **kwargs):
            self.calls += 1
            return method(*args, **kwargs)
        return counted


def build(args: argparse.Namespace, loaded: tuple, fused: bool):
    """(a function decoding the whole subset -> (reference, hypothesis) pairs, audio seconds, chunks, LM counter)
    for the search of ``args.one`` over ``loaded`` (``decoding.load``'s), with the LM if ``fused``."""
    mode, beam, limit = args.one[0], int(args.one[1]), int(args.one[2])
    model, task, batches = loaded
    words, reference = words_and_references(task)
    seconds = sum(int(n) for batch in batches for n in batch["net_input"]["src_lengths"]) / FEATURE_FRAMES_PER_SECOND
    lm = load_language_model(args.lm_path, args.data, torch.device("cpu")) if fused else None
    counter = CallCounter(lm) if lm is not None else None
    generator = TransducerGenerator([model], task.target_dictionary, beam=beam, max_symbols_per_frame=limit,
                                    length_norm=LENGTH_NORM, lm_model=lm, lm_weight=args.lm_weight if lm else 0.0)
    if mode == "offline":
        def run():
            return [(reference(batch, i), words(hypotheses[0]["tokens"])) for batch in batches
                    for i, hypotheses in enumerate(generator.generate([model], batch))]
        return run, seconds, 0, counter

    singles = [_single(batch, i) for batch in batches for i in range(len(batch["id"]))][:args.stream_utterances]
    chunk = round(args.chunk_ms * FEATURE_FRAMES_PER_SECOND / 1000)
    chunks = sum(-(-int(s["net_input"]["src_lengths"][0]) // chunk) for s in singles)

    @torch.no_grad()
    def run():
        pairs = []
        for single in singles:
            features, cache = single["net_input"]["src_tokens"], {}
            search = generator.search(1, features.device)
            for start in range(0, features.shape[1], chunk):
                final = start + chunk >= features.shape[1]
                search.advance(model.encoder.step(features[:, start:start + chunk], cache, final=final))
            best = search.finish(1, generator.length_norm)[0][0]
            pairs.append((reference(single, 0), words(best.tokens)))
        return pairs
    return run, seconds, chunks, counter


def measure_one(args: argparse.Namespace) -> dict:
    """``--what memory``: the peak memory of the ``args.one[3]`` pass (plain or fused). ``--what time``: both passes,
    interleaved: their median seconds, and the audio seconds, chunks, WER and LM calls of each."""
    loaded = load(args.checkpoint, args.data, args.subset, args.max_tokens)
    if args.what == "memory":
        return measure(build(args, loaded, args.one[3] == "fused")[0], "cpu", args.repeats, "memory")
    passes = {kind: build(args, loaded, kind == "fused") for kind in ("plain", "fused")}
    times: dict[str, list[float]] = {kind: [] for kind in passes}
    cpu_times: dict[str, list[float]] = {kind: [] for kind in passes}
    pairs: dict[str, list] = {}
    for kind, (run, *_) in passes.items():
        run()  # warm-up
    for repeat in range(args.repeats):
        for kind, (run, _, _, counter) in passes.items():
            if counter is not None:
                counter.calls = 0  # the LM calls of one pass: the last
            start, cpu_start = time.perf_counter(), time.process_time()
            pairs[kind] = run()
            times[kind].append(time.perf_counter() - start)
            cpu_times[kind].append(time.process_time() - cpu_start)
    return {kind: {"seconds": statistics.median(times[kind]), "cpu_seconds": statistics.median(cpu_times[kind]),
                   "audio_seconds": seconds, "chunks": chunks,
                   "wer": word_error_rate(pairs[kind]), "lm_calls": counter.calls if counter is not None else 0}
            for kind, (_, seconds, chunks, counter) in passes.items()}


def streamable(checkpoint: Path, data: Path, subset: str, max_tokens: int) -> bool:
    """Whether the checkpoint's encoder can run chunk by chunk (a causal model); ``max_tokens``: a batch size the
    subset's longest utterance fits in (the task refuses one it does not)."""
    model, _, _ = load(checkpoint, data, subset, max_tokens)
    try:
        model.encoder.check_streamable()
    except ValueError:
        return False
    return True


def table(args: argparse.Namespace, mode: str) -> None:
    """One row per search: plain and fused, each measured in a child process."""
    common = ["--checkpoint", str(args.checkpoint), "--data", str(args.data), "--subset", args.subset,
              "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats), "--threads", str(args.threads),
              "--lm-path", str(args.lm_path), "--lm-weight", str(args.lm_weight), "--chunk-ms", str(args.chunk_ms),
              "--stream-utterances", str(args.stream_utterances), "--device", args.device]
    if mode == "offline":
        print("| search (batched) | RTF plain | RTF fused | fused / plain | CPU s plain / fused | fused / plain (CPU) "
              "| LM calls | peak MiB plain / fused | WER % plain / fused |")
    else:
        print(f"| search (streaming, {args.chunk_ms:g} ms chunks, {args.stream_utterances} utterances one at a time) "
              f"| ms per chunk plain | ms per chunk fused | fused / plain | CPU s plain / fused | fused / plain (CPU) "
              f"| LM calls | peak MiB plain / fused | WER % plain / fused |")
    print("|---|---|---|---|---|---|---|---|---|")
    versions = [(" (baseline)", dict(os.environ, PYTHONPATH=str(args.baseline)))] if args.baseline else []
    for label, beam, limit in SEARCHES:
        if label not in args.searches:
            continue
        for suffix, env in versions + [("", None)]:
            row(args, mode, label + suffix, beam, limit, common, env)


def row(args: argparse.Namespace, mode: str, label: str, beam: int, limit: int, common: list[str],
        env: dict | None) -> None:
    """One search's row: plain and fused timed in one child (``env``: its environment, e.g. the baseline's
    ``PYTHONPATH``), and their peak memory in one child each."""
    timed = child(__file__, ["--one", mode, str(beam), str(limit), "both", "--what", "time", *common], env)
    plain, fused = timed["plain"], timed["fused"]
    memory_env = dict(env or os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # as measurement.in_subprocess
    if args.skip_memory:
        memory = "not measured"
    else:
        peaks = [child(__file__, ["--one", mode, str(beam), str(limit), kind, "--what", "memory", *common],
                       memory_env)["peak_mib"] for kind in ("plain", "fused")]
        memory = f"{peaks[0]:.0f} / {peaks[1]:.0f}"
    if mode == "offline":
        cost = [r["seconds"] / r["audio_seconds"] for r in (plain, fused)]
        shown = [f"{c:.4f}" for c in cost]
    else:
        cost = [1e3 * r["seconds"] / r["chunks"] for r in (plain, fused)]
        shown = [f"{c:.2f}" for c in cost]
    print(f"| {label} | {shown[0]} | {shown[1]} | {cost[1] / cost[0]:.2f}x "
          f"| {plain['cpu_seconds']:.2f} / {fused['cpu_seconds']:.2f} "
          f"| {fused['cpu_seconds'] / plain['cpu_seconds']:.2f}x | {fused['lm_calls']} "
          f"| {memory} | {plain['wer']:.1f} / {fused['wer']:.1f} |",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--subset", default="test-mini")
    parser.add_argument("--max-tokens", type=int, default=20000, help="offline decoding: frames per batch")
    parser.add_argument("--lm-path", type=Path, required=True, help="the language model to fuse")
    parser.add_argument("--lm-weight", type=float, default=0.1, help="the fused LM's weight (default 0.1)")
    parser.add_argument("--chunk-ms", type=float, default=320.0, help="streaming: audio per chunk")
    parser.add_argument("--stream-utterances", type=int, default=20, help="streaming: the first N utterances")
    parser.add_argument("--searches", nargs="+", choices=[label for label, _, _ in SEARCHES],
                        default=[label for label, _, _ in SEARCHES])
    parser.add_argument("--skip-memory", action="store_true",
                        help="leave the peak-memory children out (faster; the column then says 'not measured')")
    parser.add_argument("--tables", nargs="+", choices=("offline", "streaming"), default=["offline", "streaming"])
    parser.add_argument("--baseline", type=Path, help="a checkout whose search to measure too, before this one's")
    add_measurement_arguments(parser, repeats=2)
    parser.add_argument("--one", nargs=4, metavar=("MODE", "BEAM", "LIMIT", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device != "cpu":
        parser.error("lm_fusion_speed.py measures on the CPU only")
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure_one(args)))
        return
    for path in (args.checkpoint, args.lm_path):
        if not path.is_file():
            parser.error(f"no checkpoint at {path}")
    print(f"# LM fusion on {args.subset} ({args.checkpoint.name}, LM {args.lm_path.name} at weight {args.lm_weight}), "
          f"CPU, {args.threads} threads, median of {args.repeats} interleaved passes, torch {torch.__version__}, search from "
          f"{Path(ssm_fairseq.__file__).parent}" + (f", baseline from {args.baseline}" if args.baseline else "") + "\n")
    if "offline" in args.tables:
        table(args, "offline")
        print()
    if "streaming" in args.tables:
        if streamable(args.checkpoint, args.data, args.subset, args.max_tokens):
            table(args, "streaming")
        else:
            print(f"(no streaming table: {args.checkpoint.name} is not a causal model)")


if __name__ == "__main__":
    main()
