#!/usr/bin/env python
"""Cost of one chunk of a long stream: the streaming MSSM encoder against a causal transformer that re-encodes.

Two causal encoders of the same width, depth and sub-sampler (default: the mini conf's, ``conf/mini_streaming.sh``:
width 144, FFN 576, 5 layers, ``tr`` stride 4; random weights, eval mode, no autograd: the cost does not depend on
the weights or the audio, so the features are random):

* ``mssm streaming``: causal MSSM layers run chunk by chunk (``SpeechEncoder.step``), each SSM carrying its
  ``D x N`` state: a chunk's work is the same at minute 10 as at minute 1.
* ``transformer re-encoding``: causal self-attention (and sinusoidal positions) re-runs over the whole stream so
  far at every chunk, which is what an attention encoder without a key/value cache (fairseq's) does to stream.

The MSSM encoder runs the whole stream (``--minutes``, default 10) chunk by chunk and reports the mean time per chunk
over the first minute and over the last one; the transformer is timed (best of ``--repeats``) on the chunk that ends
minute 1 and the one that ends minute 10. Peak memory is the growth of the process's peak resident set during one
chunk (``measurement.py``; CUDA: ``max_memory_allocated``); on CPU the script runs with glibc's mmap threshold at
64 KiB (``MALLOC_MMAP_THRESHOLD_``, set by re-running itself) so that freed large buffers return to the system
and every chunk's large buffers are counted, which slows large allocations for both encoders alike. Run alone: a
second busy process slows both.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from measurement import add_measurement_arguments, peak_memory_mib
from ssm_fairseq.layers.encoder_layer import LayerConfig
from ssm_fairseq.asr.encoder.speech_encoder import SpeechEncoder

FRAMES_PER_SECOND = 100


def encoder(layer_type: str, args: argparse.Namespace) -> SpeechEncoder:
    torch.manual_seed(0)
    cfg = LayerConfig(dim=args.width, ffn_dim=4 * args.width, attention_heads=args.heads, ssm_heads=4,
                      ssm_state_size=args.state_size, dropout=0.0, causal=True)
    return SpeechEncoder(layer_type, args.layers, cfg, subsampler="tr", tr_stride=4,
                         positions=layer_type == "transformer").to(args.device).eval()


@torch.no_grad()
def mssm_stream(args: argparse.Namespace) -> dict:
    """Mean ms per chunk over the first and the last minute, and the peak memory of a chunk in each."""
    model, chunk = encoder("mssm", args), args.chunk_ms // 10
    chunks_per_minute = 60 * FRAMES_PER_SECOND // chunk
    total = args.minutes * chunks_per_minute
    features = torch.randn(1, chunk, 80, device=args.device)
    cache: dict = {}
    times, memory = [], {}
    for n in range(total):
        start = time.perf_counter()
        model.step(features, cache)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if n in (chunks_per_minute - 1, total - 1):  # the last chunk of minute 1 and of the stream
            memory[n] = peak_memory_mib(lambda: model.step(features, cache), args.device)
    first, last = times[:chunks_per_minute], times[-chunks_per_minute:]
    return {"minute 1": (1000 * sum(first) / len(first), memory[chunks_per_minute - 1]),
            f"minute {args.minutes}": (1000 * sum(last) / len(last), memory[total - 1])}


@torch.no_grad()
def transformer_reencoding(args: argparse.Namespace) -> dict:
    """ms (best of repeats) and peak memory of the chunk that ends minute 1 and the one that ends the stream."""
    model, results = encoder("transformer", args), {}
    for minute in (1, args.minutes):
        frames = minute * 60 * FRAMES_PER_SECOND
        features = torch.randn(1, frames, 80, device=args.device)
        lengths = torch.tensor([frames], device=args.device)
        run = lambda: model(features, lengths)  # noqa: E731
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            run()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        results[f"minute {minute}"] = (1000 * best, peak_memory_mib(run, args.device))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=int, default=10, help="length of the stream")
    parser.add_argument("--chunk-ms", type=int, default=320, help="audio per chunk (a multiple of 40 ms)")
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--width", type=int, default=144)
    parser.add_argument("--heads", type=int, default=4, help="attention heads of the transformer")
    parser.add_argument("--state-size", type=int, default=16, help="MSSM state size")
    add_measurement_arguments(parser, repeats=2)
    args = parser.parse_args()
    if args.chunk_ms % 40 or args.minutes < 2:
        parser.error("--chunk-ms must be a multiple of 40 (4 frames of 10 ms: one encoder frame), --minutes >= 2")
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # see the docstring: memory measured per chunk
        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
    torch.set_num_threads(args.threads)
    print(f"# One {args.chunk_ms} ms chunk of a {args.minutes}-minute stream: causal encoders, {args.layers} layers, "
          f"width {args.width}, tr sub-sampler; device {args.device}, {args.threads} threads, torch "
          f"{torch.__version__}\n")
    rows = {"mssm streaming (state carried)": mssm_stream(args),
            "transformer re-encoding (whole left context)": transformer_reencoding(args)}
    print("| encoder | at | ms per chunk | peak MiB per chunk | real-time factor |")
    print("|---|---|---|---|---|")
    for name, results in rows.items():
        for at, (ms, mib) in results.items():
            print(f"| {name} | {at} | {ms:.2f} | {mib:.1f} | {ms / args.chunk_ms:.4f} |")
    for name, results in rows.items():
        (ms1, mib1), (ms10, mib10) = results.values()
        memory = f"{mib10 / mib1:.2f}x" if min(mib1, mib10) >= 0.1 else f"{mib1:.1f} and {mib10:.1f} MiB"
        print(f"\n{name}: minute {args.minutes} against minute 1: {ms10 / ms1:.2f}x time, memory {memory}", end="")
    print()


if __name__ == "__main__":
    main()
