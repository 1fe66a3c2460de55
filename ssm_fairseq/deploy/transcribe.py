"""``ssm-transcribe --onnx DIR``: the command line's transcription with an exported directory on ONNX Runtime.

``run(args)`` takes ``ssm-transcribe``'s parsed arguments (``ssm_fairseq.cli.transcribe.parse_args``) with
``args.onnx`` (the directory) and ``args.onnx_precision`` (``"fp32"`` or ``"int8"``), and writes the same outputs
through the command line's ``Output``, which it is given (``--format``, ``--output-dir``, ``--timestamps``; ``--endpoints`` cuts each
transcript's timed words as offline transcription cuts them). Offline and ``--stream`` give the same transcripts: a
file is one stream either way, fed at once or in ``--chunk-ms`` chunks (partial transcripts to stderr). Flags that
need PyTorch are refused, named: ``--lm-path``, ``--fp16``/``--bf16``, and ``--endpoints`` with ``--stream`` (a
stream restarting its search at each endpoint). ``--cpu``, ``--max-tokens`` and ``--batch-size`` do not apply
(ONNX Runtime on the CPU, one file at a time). Imports no torch and no fairseq.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

from ..asr.transcripts import InputError, Segment
from .errors import DeployError

logger = logging.getLogger("ssm_fairseq.transcribe")

DEFAULT_CHUNK_MS = 320


def unsupported(args: argparse.Namespace) -> str | None:
    """Why ``--onnx`` cannot honour these arguments, or None."""
    if getattr(args, "lm_path", None):
        return "--lm-path: language-model fusion runs in PyTorch; transcribe with --checkpoint"
    if getattr(args, "precision", "float32") != "float32":
        return f"--{'fp16' if args.precision == 'float16' else 'bf16'}: with --onnx choose --onnx-precision fp32 or int8"
    if getattr(args, "stream", False) and getattr(args, "endpoint_rules", None) is not None:
        return "--endpoints with --stream restarts the search at each endpoint, which --onnx does not do: drop --stream"
    return None


def _segments(transcript, duration: float, args: argparse.Namespace, frame_seconds: float) -> list[Segment]:
    """A file's ``TimedTranscript`` -> its segments: one over ``[0, duration]``, or those ``--endpoints`` cuts (the
    model's encoder frame ``frame_seconds`` long); the words kept with ``--timestamps`` only."""
    rules = getattr(args, "endpoint_rules", None)
    if rules is None:
        segments = [Segment(0.0, duration, transcript.text, list(transcript.words))]
    else:
        from ..asr.endpoints import split_words

        segments = split_words(transcript.words, duration, rules, transcript.text, frame_seconds=frame_seconds)
    return segments if args.timestamps else [segment._replace(words=[]) for segment in segments]


def transcribe(args: argparse.Namespace, output) -> None:
    """Every file transcribed (and checked first) with the recognizer ``args`` ask for; segments to ``output``."""
    import soundfile

    from .recognizer import OnnxRecognizer

    recognizer = OnnxRecognizer(args.onnx, getattr(args, "onnx_precision", "fp32"), beam=args.beam,
                                search=args.search, max_symbols_per_frame=args.max_symbols_per_frame,
                                lenpen=args.lenpen, blank_penalty=args.blank_penalty)
    logger.info(f"{args.onnx}: ONNX Runtime, {recognizer.model.precision}; "
                + ("greedy search" if args.beam == 1 else f"beam {args.beam}, {args.search} search"))
    timed = args.timestamps or getattr(args, "endpoint_rules", None) is not None
    start = time.perf_counter()
    if args.stream:
        stream, chunk_ms = recognizer.stream(timed), args.chunk_ms or DEFAULT_CHUNK_MS
        problems = []
        for path in args.audio:
            try:
                soundfile.info(path)
            except Exception as error:  # soundfile raises several types
                problems.append(f"{path}: unreadable audio ({error})")
        if problems:
            raise InputError(problems)
        for path in args.audio:
            def show(seconds: float, text: str, path: str = path) -> None:
                print(f"{path} [{seconds:.2f} s] {text}", file=sys.stderr, flush=True)
            try:
                transcript = stream.stream_file(path, chunk_ms, show)
            except ValueError as error:
                raise InputError([f"{path}: {error}"]) from error
            output.add(path, _segments(transcript, stream_duration(path), args, recognizer.frame_seconds))
    else:
        for path, transcript in zip(args.audio, recognizer.transcribe(args.audio, timestamps=True)):
            output.add(path, _segments(transcript, stream_duration(path), args, recognizer.frame_seconds))
    output.close()
    logger.info(f"transcribed {len(args.audio)} files in {time.perf_counter() - start:.1f} s")


def stream_duration(path: str) -> float:
    import soundfile

    info = soundfile.info(path)
    return info.frames / info.samplerate


def run(args: argparse.Namespace, output) -> int:
    """``ssm-transcribe --onnx``: 0, or 1 after logging what cannot be transcribed (files, flags, the directory).
    ``output``: where each file's segments go, ``output.add(path, segments)`` then ``output.close()`` (the command
    line's ``Output(args)``; passed in, so that this module does not import the command line that imports it)."""
    problem = unsupported(args)
    if problem:
        logger.error(problem)
        return 1
    try:
        transcribe(args, output)
    except InputError as error:
        for line in error.problems:
            logger.error(line)
        logger.error(f"{len(error.problems)} of {len(args.audio)} audio files cannot be transcribed (listed above)")
        return 1
    except (DeployError, FileNotFoundError, ValueError) as error:
        logger.error(f"{type(error).__name__}: {error}")
        return 1
    return 0
