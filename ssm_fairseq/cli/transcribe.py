"""``ssm-transcribe``: audio files -> text with a trained transducer checkpoint, decoded as ``fairseq-generate``
decodes.

    ssm-transcribe --checkpoint exp/librispeech/checkpoints/mssm_transducer/checkpoint_avg10.pt a.flac b.wav ...

(``python -m ssm_fairseq.cli.transcribe`` and ``python -m ssm_fairseq.transcribe`` are the same) prints
``PATH<TAB>transcript`` for every file, in the order given. ``--stream --chunk-ms 320`` decodes each file as a live
stream instead, with a causal model (``ssm_fairseq.asr.stream``): the partial transcript goes to stderr whenever it
changes (``PATH [seconds] text``) and the same final lines to stdout. With ``--timestamps`` each line gets a third
column, the transcript's words with their times as a JSON list of ``[word, start, end]`` (seconds from the start
of the file, rounded to 0.01)::

    a.flac<TAB>HELLO WORLD<TAB>[["HELLO", 0.32, 0.6], ["WORLD", 0.64, 1.04]]

(JSON escapes any tab or line break, so a line splits on its first two tabs). A word's times are those of the
encoder frames at which the search emitted its first and last units (``ssm_fairseq.asr.search.word_timestamps``):
when the model decided on the word, which may lag the sound.

The checkpoint (``--task speech_transducer``, any ``*_transducer`` architecture, averaged or not) names its data
directory and ``config.yaml`` (``--data-dir`` replaces it when the checkpoint has moved machines); features are
those of training (``ssm_fairseq.asr.features.audio_features``, then the config's transforms for evaluation splits),
and files
are batched and decoded as ``fairseq-generate`` batches a manifest (``ssm_fairseq.asr.offline``), with the units
joined into words as ``--post-process sentencepiece`` joins them. Every file is checked before decoding: missing,
unreadable, empty or too long ones are all named in one error, and none is skipped. File names holding a tab or a
line break are refused (they would break the ``PATH<TAB>transcript`` lines). The checkpoint is checked as
fairseq-generate checks it (``ssm_fairseq.integrity.checkpoint_checks``). From Python, use
``ssm_fairseq.asr.Recognizer``.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import fields

from ..asr.offline import file_frames
from ..asr.options import DEFAULT_MAX_TOKENS, DecodingOptions
from ..asr.recognizer import Recognizer
from ..asr.samples import chunk_samples
from ..asr.transcripts import InputError, TimedTranscript, timed_words_json
from ..asr.search.hypothesis import MAX_SYMBOLS_PER_FRAME
from ..asr.transducer.task import SEARCHES

logger = logging.getLogger("ssm_fairseq.transcribe")

DEFAULT_CHUNK_MS = 320


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The search's options, named as ``DecodingOptions``' fields (and ``fairseq-generate``'s flags)."""
    parser.add_argument("--beam", type=int, default=4, help="1: greedy search; N: beam search (default 4)")
    parser.add_argument("--search", choices=SEARCHES, default="exact",
                        help="exact: frame-synchronous search; modified: one label per frame")
    parser.add_argument("--max-symbols-per-frame", type=int, default=MAX_SYMBOLS_PER_FRAME, metavar="N",
                        help=f"labels a hypothesis may emit within one encoder frame (default {MAX_SYMBOLS_PER_FRAME})")
    parser.add_argument("--lenpen", type=float, default=1.0,
                        help="beam search ranks final hypotheses by score / (labels + 1) ** lenpen (default 1)")
    parser.add_argument("--blank-penalty", type=float, default=0.0, metavar="P",
                        help="subtract P from the blank's logit during search (default 0)")
    parser.add_argument("--lm-path", default=None,
                        help="a fairseq language model over the transducer's units, fused into the search")
    parser.add_argument("--lm-weight", type=float, default=0.0, help="the language model's weight (default 0)")
    parser.add_argument("--lm-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="add the LM's end-of-sentence score to finished hypotheses (default: on)")


def _add_running_arguments(parser: argparse.ArgumentParser) -> None:
    """Batching, streaming, device and precision, named as ``DecodingOptions``' fields where they are some."""
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"most feature frames (10 ms) in a batch (default {DEFAULT_MAX_TOKENS} unless "
                             "--batch-size is given)")
    parser.add_argument("--batch-size", type=int, default=None, help="most files in a batch")
    parser.add_argument("--timestamps", action="store_true",
                        help="add a third column: the words with their times, a JSON list of [word, start, end] in "
                             "seconds (rounded to 0.01), from the encoder frames at which the search emitted each "
                             "word's first and last units (when the model decided, which may lag the sound)")
    parser.add_argument("--stream", action="store_true",
                        help="decode each file as a live stream, chunk by chunk (a causal model trained on global "
                             "CMVN, e.g. --arch mssm_transducer_streaming): the partial transcript goes to stderr "
                             "whenever it changes, the final lines to stdout as without --stream; no length limit, "
                             "and --max-tokens / --batch-size do not apply (one file at a time)")
    parser.add_argument("--chunk-ms", type=float, default=None,
                        help=f"with --stream: milliseconds of audio per chunk, rounded to whole samples (default "
                             f"{DEFAULT_CHUNK_MS})")
    parser.add_argument("--cpu", action="store_true", help="decode on CPU even if CUDA is available")
    precision = parser.add_mutually_exclusive_group()
    for flag, dtype in (("--fp16", "float16"), ("--bf16", "bfloat16")):
        precision.add_argument(flag, action="store_const", const=dtype, dest="precision", default="float32",
                               help=f"decode in {dtype}, as fairseq-generate {flag}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a usage error (exit 2) for file names a line cannot show, or a bad --chunk-ms."""
    parser = argparse.ArgumentParser(prog="ssm-transcribe",
                                     description="Transcribe audio files with a speech_transducer checkpoint: "
                                                 "prints PATH<TAB>transcript per file, in input order "
                                                 "(PATH<TAB>transcript<TAB>timed words with --timestamps).")
    parser.add_argument("audio", nargs="+", help="audio files (any format soundfile reads, any rate and channels)")
    parser.add_argument("--checkpoint", required=True, help="fairseq-train --task speech_transducer checkpoint")
    parser.add_argument("--data-dir", default=None,
                        help="data directory with config.yaml and the dictionary "
                             "(default: the one the checkpoint was trained on)")
    _add_search_arguments(parser)
    _add_running_arguments(parser)
    args = parser.parse_args(argv)
    unprintable = [path for path in args.audio if any(c in path for c in "\t\n\r")]
    if unprintable:
        parser.error(f"{unprintable[0]!r}: a file name holding a tab or a line break cannot be printed as "
                     f"PATH<TAB>transcript; rename the file (or call ssm_fairseq.asr.Recognizer from Python)")
    if args.chunk_ms is not None and not args.stream:
        parser.error("--chunk-ms sets the chunks of --stream; add --stream")
    try:
        chunk_samples(args.chunk_ms or DEFAULT_CHUNK_MS)
    except ValueError as error:
        parser.error(f"--chunk-ms: {error}")
    return args


def load_recognizer(args: argparse.Namespace) -> Recognizer:
    """The ``Recognizer`` the command line asks for: every ``DecodingOptions`` field from its flag."""
    options = {field.name: getattr(args, field.name) for field in fields(DecodingOptions)}
    return Recognizer(args.checkpoint, data_dir=args.data_dir, device="cpu" if args.cpu else None, **options)


def print_line(path: str, transcript: TimedTranscript, timestamps: bool) -> None:
    """``PATH<TAB>transcript`` (and ``<TAB>`` the timed words as JSON with ``timestamps``) on stdout."""
    columns = [path, transcript.text] + ([timed_words_json(transcript.words)] if timestamps else [])
    print("\t".join(columns), flush=True)


def transcribe_files(args: argparse.Namespace) -> None:
    """Offline: every file checked, then decoded in batches; the lines printed in input order."""
    recognizer = load_recognizer(args)
    start = time.perf_counter()
    texts = recognizer.transcribe(args.audio, timestamps=args.timestamps)
    for path, text in zip(args.audio, texts):
        print_line(path, text if args.timestamps else TimedTranscript(text, []), args.timestamps)
    logger.info(f"transcribed {len(texts)} files in {time.perf_counter() - start:.1f} s")


def stream_files(args: argparse.Namespace) -> None:
    """``--stream``: every file checked before the model loads, then streamed in ``--chunk-ms`` chunks, one after
    the other, through one stream; partial transcripts to stderr."""
    file_frames(args.audio)
    stream = load_recognizer(args).stream(args.timestamps)
    chunk_ms, start = args.chunk_ms or DEFAULT_CHUNK_MS, time.perf_counter()
    for path in args.audio:
        def show(seconds: float, text: str, path: str = path) -> None:
            print(f"{path} [{seconds:.2f} s] {text}", file=sys.stderr, flush=True)
        print_line(path, stream.stream_file(path, chunk_ms, show), args.timestamps)
    logger.info(f"streamed {len(args.audio)} files in {chunk_ms:g} ms chunks in {time.perf_counter() - start:.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr, force=True)  # force: importing fairseq configured logging already
    try:
        (stream_files if args.stream else transcribe_files)(args)
    except InputError as error:
        for problem in error.problems:
            logger.error(problem)
        logger.error(f"{len(error.problems)} of {len(args.audio)} audio files cannot be transcribed (listed above)")
        return 1
    except (FileNotFoundError, ValueError) as error:  # a missing data file, a foreign checkpoint, bad audio, a
        logger.error(str(error))                      # model or data that cannot stream
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
