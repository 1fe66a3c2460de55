#!/usr/bin/env python
"""Streaming recognition with a causal transducer checkpoint: WER, real-time factor and latency per chunk size.

    python scripts/benchmarks/streaming_recognition.py --checkpoint exp/librispeech_mini_streaming/checkpoints/\
mssm_transducer_streaming/checkpoint_avg3.pt --corpus-root recipes/librispeech/mini/LibriSpeech \
--subsets dev-mini test-mini --chunk-ms 160 320 640

For each subset (its manifest in the checkpoint's data directory gives the utterances and reference transcripts;
the audio is read from the LibriSpeech-layout corpus), every utterance is transcribed offline (``Transcriber``:
the whole utterance at once) and streamed (``StreamingTranscriber``) in chunks of each ``--chunk-ms``, fed as
fast as they are decoded. The table gives the WER of each (words as ``fairseq-generate --scoring wer`` counts
them), how many streamed transcripts differ from the offline ones (0 unless float rounding flips a near tie), the
real-time factor (compute seconds per second of audio: offline's includes reading the audio files, streaming's
starts from samples in memory; both include the filterbanks) and the latency of a chunk: the compute time from its
arrival to its partial transcript (mean, 95th percentile and max over all chunks). A live stream adds the chunk's
own duration (its audio must have arrived) and up to one sub-sampling group (30 ms) and 15 ms of filterbank window
before its last frames are decoded. Run alone, on the threads given (``--threads``, default 2).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from decoding import word_error_rate
from ssm_fairseq.asr.features.audio_features import SAMPLE_RATE, to_16k_mono
from ssm_fairseq.asr.streaming_transcriber import StreamingTranscriber


def utterances(data_dir: Path, corpus_root: Path, subset: str) -> list[tuple[Path, str]]:
    """(audio path, reference transcript) of every utterance of ``subset``'s manifest, in manifest order."""
    with open(data_dir / f"{subset}.tsv", newline="") as manifest:
        rows = list(csv.DictReader(manifest, delimiter="\t", quoting=csv.QUOTE_NONE))
    found = []
    for row in rows:
        speaker, chapter, _ = row["id"].split("-")
        path = corpus_root / subset / speaker / chapter / f"{row['id']}.flac"
        if not path.is_file():
            sys.exit(f"{path}: audio of {subset}'s utterance {row['id']} not found under --corpus-root")
        found.append((path, row["tgt_text"]))
    if not found:
        sys.exit(f"{data_dir / f'{subset}.tsv'}: no utterances")
    return found


def stream(transcriber: StreamingTranscriber, audio: np.ndarray, chunk_samples: int) -> tuple[str, list[float]]:
    """(final transcript, compute seconds of each chunk) of one utterance fed ``chunk_samples`` at a time."""
    latencies = []
    for start in range(0, len(audio), chunk_samples):
        begin = time.perf_counter()
        transcriber.accept_waveform(audio[start:start + chunk_samples])
        latencies.append(time.perf_counter() - begin)
    begin = time.perf_counter()
    text, _ = transcriber.finish()
    latencies[-1] += time.perf_counter() - begin  # the last chunk's result is the final transcript
    return text, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a causal (streaming) transducer checkpoint")
    parser.add_argument("--corpus-root", required=True, type=Path, help="LibriSpeech-layout corpus with the audio")
    parser.add_argument("--subsets", nargs="+", default=["dev-mini", "test-mini"])
    parser.add_argument("--chunk-ms", type=int, nargs="+", default=[160, 320, 640])
    parser.add_argument("--beam", type=int, default=4, help="1: greedy search (default 4, as the recipe)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transcriber = StreamingTranscriber(args.checkpoint, beam=args.beam, device="cpu")
    data_dir = Path(transcriber.offline.task.args.data)
    print(f"# Streaming {args.checkpoint} (beam {args.beam}), {args.threads} threads, torch {torch.__version__}\n")
    print("| subset | decoding | WER % | transcripts differing from offline | real-time factor "
          "| chunk latency ms: mean / p95 / max |")
    print("|---|---|---|---|---|---|")
    for subset in args.subsets:
        items = utterances(data_dir, args.corpus_root, subset)
        references = [text for _, text in items]
        audio = [to_16k_mono(*sf.read(str(path), dtype="float32", always_2d=True))[0] for path, _ in items]
        seconds = sum(len(a) for a in audio) / SAMPLE_RATE
        begin = time.perf_counter()
        offline = transcriber.offline.transcribe([path for path, _ in items])
        rtf = (time.perf_counter() - begin) / seconds
        wer = word_error_rate(list(zip(references, offline)))
        print(f"| {subset} | offline (whole utterance, batched) | {wer:.2f} | | {rtf:.4f} | |")
        for chunk_ms in args.chunk_ms:
            texts, latencies = [], []
            for samples in audio:
                text, chunk_latencies = stream(transcriber, samples, chunk_ms * SAMPLE_RATE // 1000)
                texts.append(text)
                latencies += chunk_latencies
            ms = 1000 * np.array(latencies)
            differing = sum(t != o for t, o in zip(texts, offline))
            wer = word_error_rate(list(zip(references, texts)))
            print(f"| {subset} | streaming, {chunk_ms} ms chunks | {wer:.2f} | "
                  f"{differing} of {len(texts)} | {sum(latencies) / seconds:.4f} | "
                  f"{ms.mean():.1f} / {np.percentile(ms, 95):.1f} / {ms.max():.1f} |")


if __name__ == "__main__":
    main()
