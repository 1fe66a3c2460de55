#!/usr/bin/env python
"""Many live streams on one causal transducer: real-time factor and latency per chunk, the streams stepped as one
batch (``Recognizer.step_streams``) and one after the other (``Stream.accept_waveform``).

    flock /tmp/cpu.lock python scripts/benchmarks/many_streams.py \
        --checkpoint /work/models/mini_streaming/checkpoints/mssm_transducer_streaming/checkpoint_avg3.pt

For each number of streams ``N`` (``--streams``, default 1 2 4 8 12 16), ``N`` streams each get ``--seconds`` of
speech (test-mini utterances joined one after the other, each stream starting at another utterance, so their
transcripts differ) in ``--chunk-ms`` chunks: at every step each stream gets its next chunk, as a server gets
them from ``N`` live connections, and the step ends when every stream has its partial transcript. The streams are
finished (their last frames and final transcripts) after the last step, outside the timing.

Columns, for each way of stepping: the real-time factor (``RTF``: wall-clock seconds per second of audio of the
``N`` streams together: below 1, ``N`` live streams keep up), ``CPU``: the same in CPU seconds of the process (all
its threads; on a machine shared with other work, wall-clock time also counts the waits for a core, CPU time does
not: with ``--threads 1`` it is the RTF this process would have on a core of its own), the latency of a chunk
(wall-clock seconds from the step's start to its partial transcripts: mean and max over the steps; a live stream
adds the chunk's own duration), and the share of the wall-clock time spent in the encoder (the rest: filterbanks,
feature transforms, the searches, the detokenizer). ``same`` says whether each stream's final transcript is the same both ways. ``peak MiB``: the growth
of the process's peak resident set size during the batched run (Linux ``/proc``; the model loaded before). Run
under ``flock /tmp/cpu.lock`` on a quiet machine, on ``--threads`` threads (default 2).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from measurement import reset_peak_rss, status_kib
from ssm_fairseq.asr import Recognizer

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = REPO / "recipes/librispeech/mini/LibriSpeech"


def stream_audio(files: list[Path], streams: int, seconds: float) -> list[np.ndarray]:
    """``streams`` pieces of ``seconds`` of 16 kHz speech each: the files joined in turn, stream ``n`` starting at
    file ``n``."""
    audio = [sf.read(str(path), dtype="float32")[0] for path in files]
    length = int(seconds * 16000)
    pieces = []
    for n in range(streams):
        joined, k = [], n
        while sum(map(len, joined)) < length:
            joined.append(audio[k % len(audio)])
            k += 1
        pieces.append(np.concatenate(joined)[:length])
    return pieces


class EncoderClock:
    """Seconds spent in the recognizer's encoder ``step`` (wrapped), summed until read."""

    def __init__(self, recognizer: Recognizer):
        self.seconds = 0.0
        encoder = recognizer.model.encoder
        step = encoder.step

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        encoder.step = timed

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def run(recognizer: Recognizer, clock: EncoderClock, audio: list[np.ndarray], chunk: int, batched: bool
        ) -> tuple[list[float], float, float, list[str]]:
    """Step the streams through their audio -> each step's wall-clock seconds, the CPU seconds of all steps, the
    encoder's wall-clock seconds, the final transcripts."""
    streams = [recognizer.stream() for _ in audio]
    steps = []
    clock.take()
    cpu = time.process_time()
    for start in range(0, len(audio[0]), chunk):
        began = time.perf_counter()
        if batched:
            recognizer.step_streams({stream: samples[start:start + chunk] for stream, samples in zip(streams, audio)})
        else:
            for stream, samples in zip(streams, audio):
                stream.accept_waveform(samples[start:start + chunk])
        steps.append(time.perf_counter() - began)
    cpu = time.process_time() - cpu
    encoder = clock.take()
    return steps, cpu, encoder, [stream.finish().text for stream in streams]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--corpus-root", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--subset", default="test-mini")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16])
    parser.add_argument("--seconds", type=float, default=16.0, help="audio per stream (default 16)")
    parser.add_argument("--chunk-ms", type=float, default=320.0)
    parser.add_argument("--beam", type=int, default=4, help="1: greedy search (default 4, as the recipe decodes)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    files = sorted((args.corpus_root / args.subset).glob("*/*/*.flac"))
    if not files:
        sys.exit(f"{args.corpus_root / args.subset}: no .flac files")
    recognizer = Recognizer(args.checkpoint, device="cpu", beam=args.beam)
    clock = EncoderClock(recognizer)
    chunk = round(args.chunk_ms * 16)
    warm = stream_audio(files, 2, 2.0)
    run(recognizer, clock, warm, chunk, True)
    run(recognizer, clock, warm, chunk, False)
    print(f"{args.checkpoint}: beam {args.beam}, {args.chunk_ms:g} ms chunks, {args.seconds:g} s per stream, "
          f"{args.threads} threads; load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    ways = f"{'RTF':>6} {'CPU':>6} {'latency ms mean/max':>20} {'encoder':>7}"
    print(f"{'':>7} | {'batched (step_streams)':^42} | {'one by one (accept_waveform)':^42} |")
    header = f"{'streams':>7} | {ways} | {ways} | {'same':>4} {'peak MiB':>8}"
    print(header)
    print("-" * len(header))
    for n in args.streams:
        audio = stream_audio(files, n, args.seconds)
        before = reset_peak_rss()
        batched, batched_cpu, batched_encoder, batched_texts = run(recognizer, clock, audio, chunk, True)
        peak = (status_kib("VmHWM") - before) / 1024
        alone, alone_cpu, alone_encoder, alone_texts = run(recognizer, clock, audio, chunk, False)
        seconds = args.seconds

        def columns(steps: list[float], cpu: float, encoder: float) -> str:
            latency = f"{np.mean(steps) * 1000:.1f}/{max(steps) * 1000:.1f}"
            return (f"{sum(steps) / seconds:>6.3f} {cpu / seconds:>6.3f} {latency:>20} "
                    f"{encoder / sum(steps):>7.0%}")
        print(f"{n:>7} | {columns(batched, batched_cpu, batched_encoder)} | "
              f"{columns(alone, alone_cpu, alone_encoder)} | {'yes' if batched_texts == alone_texts else 'NO':>4} "
              f"{peak:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
