#!/usr/bin/env python
"""WER of recordings made of several utterances with pauses, streamed with each endpoint rule, beside the
utterances streamed one by one.

    python scripts/benchmarks/pause_endpoints.py --checkpoint /work/models/mini_streaming/checkpoints/\
mssm_transducer_streaming/checkpoint_avg3.pt --data /work/models/mini_streaming/data \
--corpus-root recipes/librispeech/mini/LibriSpeech --subset test-mini --group 3 --pause-seconds 1.0

The subset's utterances (manifest order) are joined ``--group`` at a time, each followed by ``--pause-seconds`` of
faint noise (one 16-bit step: a quiet room, never digital silence), and written as 16-bit recordings. Each
recording is streamed in ``--chunk-ms`` chunks (``Stream.stream_file_segments``) with:

- ``none``: no endpoints (the recording is one utterance for the model);
- ``blank``: the endpoint rules on blank frames (``EndpointRules()``: rule 2 at 0.8 s), the encoder carried on;
- ``blank+reset``: the same, the encoder restarted at each endpoint (``--endpoint-reset-encoder``);
- ``pauses S``: the audio's pauses of at least S seconds (``EndpointRules(pause_seconds=S, blank_rules=False)``,
  ``--stream --split-at-pauses S``), for each ``--pauses`` S;

and the WER is that of the recordings' joined transcripts against their joined references, beside the
utterances' own files streamed one by one (``one by one``). Words are counted as ``fairseq-generate --scoring
wer`` counts them. One model, one run: WER only, no timing (no lock needed).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from decoding import word_error_rate
from streaming_recognition import utterances
from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.endpoints import EndpointRules
from ssm_fairseq.asr.features.audio_features import SAMPLE_RATE

NOISE_FLOOR = 1 / 32768  # one 16-bit step


def joined_recordings(items: list[tuple[Path, str]], group: int, pause_seconds: float, out: Path
                      ) -> list[tuple[Path, str]]:
    """``items`` joined ``group`` at a time, each utterance followed by a pause of noise -> (recording, joined
    reference) per group."""
    rng = np.random.default_rng(0)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for first in range(0, len(items), group):
        pieces, references = [], []
        for path, text in items[first:first + group]:
            samples, rate = sf.read(path, dtype="float32")
            if rate != SAMPLE_RATE or samples.ndim != 1:
                sys.exit(f"{path}: 16 kHz mono expected")
            pieces += [samples, rng.normal(0, NOISE_FLOOR, int(pause_seconds * SAMPLE_RATE)).astype(np.float32)]
            references.append(text)
        recording = out / f"joined-{first // group:03d}.wav"
        sf.write(recording, np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
        made.append((recording, " ".join(references)))
    return made


def streamed_wer(recognizer: Recognizer, rules: EndpointRules | None, files: list[tuple[Path, str]],
                 chunk_ms: float) -> tuple[float, int]:
    """(WER of ``files`` streamed with ``rules``, segments written)."""
    pairs, segments = [], 0
    for path, reference in files:
        found = recognizer.stream(endpoints=rules).stream_file_segments(path, chunk_ms)
        segments += len(found)
        pairs.append((reference, " ".join(segment.text for segment in found if segment.text)))
    return word_error_rate(pairs), segments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a causal speech_transducer checkpoint")
    parser.add_argument("--data", type=Path, required=True, help="its data directory (the subset's manifest)")
    parser.add_argument("--corpus-root", type=Path, default=Path("recipes/librispeech/mini/LibriSpeech"))
    parser.add_argument("--subset", default="test-mini")
    parser.add_argument("--group", type=int, default=3, help="utterances per recording")
    parser.add_argument("--pause-seconds", type=float, default=1.0, help="noise after each utterance")
    parser.add_argument("--pauses", type=float, nargs="+", default=[0.3, 0.5], help="pause endpoints to try")
    parser.add_argument("--chunk-ms", type=float, default=320)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--skip-baselines", action="store_true", help="only the pause endpoints and one by one")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/pause_endpoints"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    items = utterances(args.data, args.corpus_root, args.subset)
    recognizer = Recognizer(args.checkpoint, args.data, device="cpu", beam=args.beam)
    recordings = joined_recordings(items, args.group, args.pause_seconds, args.work_dir / args.subset)
    settings: list[tuple[str, EndpointRules | None]] = []
    if not args.skip_baselines:
        settings += [("none", None), ("blank (rule 2 at 0.8 s)", EndpointRules()),
                     ("blank + encoder reset", EndpointRules(reset_encoder=True))]
    settings += [(f"pauses {seconds:g} s", EndpointRules(pause_seconds=seconds, blank_rules=False))
                 for seconds in args.pauses]
    alone, _ = streamed_wer(recognizer, None, items, args.chunk_ms)
    print(f"{args.subset}: {len(items)} utterances in {len(recordings)} recordings ({args.group} each, "
          f"{args.pause_seconds:g} s pauses of faint noise), {args.chunk_ms:g} ms chunks, beam {args.beam}\n")
    print("| endpoints | segments | WER (%) | relative to one by one |")
    print("|---|---|---|---|")
    print(f"| one by one (each utterance its own stream) | {len(items)} | {alone:.2f} | |", flush=True)
    for name, rules in settings:
        wer, segments = streamed_wer(recognizer, rules, recordings, args.chunk_ms)
        print(f"| {name} | {segments} | {wer:.2f} | {100 * (wer - alone) / alone:+.1f}% |", flush=True)


if __name__ == "__main__":
    main()
