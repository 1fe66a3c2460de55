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

(JSON escapes any tab or line break, so a line splits on its first two tabs). A word's times come from the
alignment: the encoder frames at which the search emitted its units and the blank frames around them
(``ssm_fairseq.asr.search.word_timestamps``, which says how they were measured against known word boundaries).

Segments: each file is one segment, from 0 to its length, unless ``--endpoints`` cuts it where the speaker pauses
(``ssm_fairseq.asr.endpoints``: the rules, their defaults and why; ``--endpoint-*`` and ``--max-segment`` set
them). Streamed, the search (and the LM's context) restarts at each endpoint while the encoder carries on;
offline, the transcript's timed words are cut by the same rules. ``--split-at-pauses SECONDS`` cuts
each file where its audio is quiet that long and transcribes the pieces as utterances (``ssm_fairseq.asr.
pause_segments``), which models trained on single sentences need for recordings of several; with ``--stream``, as
the pauses are heard (``EndpointRules.pause_seconds``: the encoder restarts after each). ``--format`` writes the
segments (``ssm_fairseq.asr.segment_formats``): ``text`` (the lines above), ``tsv`` (a row per segment with its start and
end), ``json`` (files, segments, and words with ``--timestamps``), ``srt`` and ``vtt`` (subtitles, a cue per
segment). ``--output-dir DIR`` writes each audio file's output to ``DIR/NAME.EXT`` (``NAME`` the audio file's name
without its extension), which subtitles of several files need.

The checkpoint (``--task speech_transducer``, any ``*_transducer`` architecture, averaged or not) names its data
directory and ``config.yaml`` (``--data-dir`` replaces it when the checkpoint has moved machines); features are
those of training (``ssm_fairseq.asr.features.audio_features``, then the config's transforms for evaluation splits;
``--cmvn-stats NPZ`` and ``--cmvn-adapt FRAMES`` replace its CMVN: ``ssm_fairseq.asr.features.adaptive_cmvn``),
and files are batched and decoded as ``fairseq-generate`` batches a manifest (``ssm_fairseq.asr.offline``), with
the units joined into words as ``--post-process sentencepiece`` joins them. Every file is checked before decoding:
missing, unreadable, empty or too long ones are all named in one error, and none is skipped. File names holding a
tab or a line break are refused (they would break the ``PATH<TAB>transcript`` lines). The checkpoint is checked as
fairseq-generate checks it (``ssm_fairseq.integrity.checkpoint_checks``). From Python, use
``ssm_fairseq.asr.Recognizer``.

This module imports nothing that needs torch (or fairseq) at module level: the model's code is imported by the
paths that run it, so that the command line parses, checks its arguments and writes its outputs without them.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from ..asr.endpoints import (DEFAULT_MAX_SEGMENT, DEFAULT_SILENCE_AFTER_SPEECH, DEFAULT_SILENCE_WITHOUT_SPEECH,
                             EndpointRules, split_words)
from ..asr.options import DEFAULT_MAX_TOKENS, MAX_SYMBOLS_PER_FRAME, SEARCHES, DecodingOptions
from ..asr.segment_formats import EXTENSIONS, FORMATS, SUBTITLE_FORMATS, FileSegments, format_files, format_tsv
from ..asr.transcripts import InputError, Segment
from ..asr.windowing import CMVN_SCOPES, Windowing
from ..atomic_files import replacing

if TYPE_CHECKING:
    from ..asr.recognizer import Recognizer

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
    parser.add_argument("--ilm-path", default=None, metavar="FILE",
                        help="LODR: the bigram of the training transcripts (scripts/build_bigram.py), with --lm-path")
    parser.add_argument("--ilm-weight", type=float, default=0.0, metavar="W",
                        help="LODR: the bigram's weight per emitted unit (default 0: off)")


def _add_running_arguments(parser: argparse.ArgumentParser) -> None:
    """Batching, long files, streaming, device and precision, named as ``DecodingOptions``' fields where they are
    some."""
    parser.add_argument("--window-seconds", type=float, default=Windowing.window_seconds, metavar="SECONDS",
                        help="offline: a file longer than this is transcribed in windows of this length, in bounded "
                             "memory (default 30; at most the model's max_source_positions)")
    parser.add_argument("--window-context-seconds", type=float, default=Windowing.window_context_seconds,
                        metavar="SECONDS", help="offline: audio each window encodes on each side of the part it keeps "
                                                "(default 4)")
    parser.add_argument("--window-cmvn", choices=CMVN_SCOPES, default=Windowing.window_cmvn,
                        help="offline windows with utterance CMVN: each window's own statistics (window, default) or "
                             "the whole file's (file: one more pass over the file)")
    parser.add_argument("--split-at-pauses", dest="pause_seconds", type=float, default=Windowing.pause_seconds,
                        metavar="SECONDS", help="cut each file where its audio pauses at least this long and "
                        "transcribe the pieces as utterances (default 0: off; 0.25-0.5 for recordings of several "
                        "sentences, which a model trained on single sentences transcribes badly whole); with "
                        "--stream, each pause ends a segment as it is heard, the encoder restarted after it "
                        "(with --endpoints too, the rules' endpoints as well)")
    parser.add_argument("--cmvn-stats", default=None, metavar="NPZ",
                        help="normalise with these global CMVN statistics (a gcmvn.npz of the training audio) in "
                             "place of the data directory's CMVN (default: the config's)")
    parser.add_argument("--cmvn-adapt", dest="cmvn_adapt_frames", type=float, default=None, metavar="FRAMES",
                        help="streaming-adaptive CMVN: after global CMVN (--cmvn-stats', else the config's), each "
                             "frame normalised by its utterance's running statistics up to it, pooled with FRAMES "
                             "frames (>= 0; 10 ms each) of the training set's; inf: global CMVN alone "
                             "(default: the config's CMVN)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"most feature frames (10 ms) in a batch (default {DEFAULT_MAX_TOKENS} unless "
                             "--batch-size is given)")
    parser.add_argument("--batch-size", type=int, default=None, help="most files in a batch")
    parser.add_argument("--stream", action="store_true",
                        help="decode each file as a live stream, chunk by chunk (a causal model trained on global "
                             "CMVN, e.g. --arch mssm_transducer_streaming): the partial transcript goes to stderr "
                             "whenever it changes, the final lines to stdout as without --stream; no length limit, "
                             "and --max-tokens / --batch-size do not apply (one file at a time)")
    parser.add_argument("--chunk-ms", type=float, default=None,
                        help=f"with --stream: milliseconds of audio per chunk, rounded to whole samples (default "
                             f"{DEFAULT_CHUNK_MS})")
    parser.add_argument("--cpu", action="store_true", help="decode on CPU even if CUDA is available")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the encoder layers (ssm_fairseq/layers/compiled.py): faster batched offline "
                             "decoding after a compilation at the first batch of each length bucket; streams stay eager")
    precision = parser.add_mutually_exclusive_group()
    for flag, dtype in (("--fp16", "float16"), ("--bf16", "bfloat16")):
        precision.add_argument(flag, action="store_const", const=dtype, dest="precision", default="float32",
                               help=f"decode in {dtype}, as fairseq-generate {flag}")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Timestamps, endpoints and the output's format and place."""
    parser.add_argument("--timestamps", action="store_true",
                        help="give the words with their times, in seconds, from the alignment (the encoder frames "
                             "at which the search emitted each word's units and the blank frames around them): "
                             "--format text adds a third column, a JSON list of [word, start, end] in "
                             "seconds (rounded to 0.01); tsv a words column; json a words list per segment")
    parser.add_argument("--format", choices=FORMATS, default="text", dest="output_format",
                        help="text: PATH<TAB>transcript per file (default); tsv: a header, then "
                             "path<TAB>start<TAB>end<TAB>text per segment; json: one document of files and their "
                             "segments; srt, vtt: subtitles, a cue per segment with text (one audio file, or "
                             "--output-dir)")
    parser.add_argument("--output-dir", type=Path, default=None, metavar="DIR",
                        help="write each audio file's output to DIR/NAME.EXT (NAME: the audio file's name without "
                             "its extension; EXT: txt, tsv, json, srt or vtt) instead of stdout")
    parser.add_argument("--endpoints", action="store_true",
                        help="cut each file into segments where the speaker pauses (an endpoint: the rules below); "
                             "streamed, the search and the LM context restart at each one. Off: a segment per file")
    parser.add_argument("--endpoint-silence-after-speech", type=float, default=None, metavar="SECONDS",
                        help="with --endpoints: a segment with words ends after this long without one (default "
                             f"{DEFAULT_SILENCE_AFTER_SPEECH:g})")
    parser.add_argument("--endpoint-silence-without-speech", type=float, default=None, metavar="SECONDS",
                        help="with --endpoints --stream: a segment without a word ends (unwritten) after this long "
                             f"(default {DEFAULT_SILENCE_WITHOUT_SPEECH:g})")
    parser.add_argument("--max-segment", type=float, default=None, metavar="SECONDS",
                        help=f"with --endpoints: the longest segment (default {DEFAULT_MAX_SEGMENT:g})")
    parser.add_argument("--endpoint-reset-encoder", action="store_true",
                        help="with --endpoints --stream: the encoder starts afresh at each endpoint too, as for a new "
                             "utterance (default: it carries its state on)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a usage error (exit 2) for file names a line cannot show, a bad --chunk-ms,
    endpoint rules without --endpoints or out of range, subtitles of several files without --output-dir, or two
    audio files whose outputs in --output-dir would have the same name."""
    parser = argparse.ArgumentParser(prog="ssm-transcribe",
                                     description="Transcribe audio files with a speech_transducer checkpoint: "
                                                 "prints PATH<TAB>transcript per file, in input order "
                                                 "(PATH<TAB>transcript<TAB>timed words with --timestamps; "
                                                 "other formats with --format).")
    parser.add_argument("audio", nargs="+", help="audio files (any format soundfile reads, any rate and channels)")
    parser.add_argument("--checkpoint", default=None, help="fairseq-train --task speech_transducer checkpoint")
    parser.add_argument("--onnx", default=None, metavar="DIR", help="instead of --checkpoint: a directory written by "
                        "ssm-export-onnx, transcribed on ONNX Runtime without torch (docs/deploy.md)")
    parser.add_argument("--onnx-precision", choices=("fp32", "int8"), default="fp32",
                        help="with --onnx: the fp32 graphs or their int8 copies (ssm-export-onnx --int8)")
    parser.add_argument("--data-dir", default=None,
                        help="data directory with config.yaml and the dictionary "
                             "(default: the one the checkpoint was trained on)")
    _add_search_arguments(parser)
    _add_running_arguments(parser)
    _add_output_arguments(parser)
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.onnx is None):
        parser.error("give --checkpoint or --onnx DIR, one of them")
    unprintable = [path for path in args.audio if any(c in path for c in "\t\n\r")]
    if unprintable:
        parser.error(f"{unprintable[0]!r}: a file name holding a tab or a line break cannot be printed as "
                     f"PATH<TAB>transcript; rename the file (or call ssm_fairseq.asr.Recognizer from Python)")
    if args.pause_seconds and args.onnx is not None:
        parser.error("--split-at-pauses cuts files with --checkpoint, offline or --stream, not with --onnx")
    if args.onnx is not None and (args.cmvn_stats is not None or args.cmvn_adapt_frames is not None):
        parser.error("--cmvn-stats and --cmvn-adapt set the features of --checkpoint; an --onnx directory applies the "
                     "CMVN it was exported with (ssm-export-onnx --cmvn-adapt)")
    if args.cmvn_adapt_frames is not None:
        try:
            DecodingOptions(cmvn_adapt_frames=args.cmvn_adapt_frames)
        except ValueError as error:
            parser.error(f"--cmvn-adapt: {error}")
    if args.chunk_ms is not None and not args.stream:
        parser.error("--chunk-ms sets the chunks of --stream; add --stream")
    if args.stream and args.onnx is None:
        from ..asr.samples import chunk_samples  # numpy and the features' constants: only when streaming
        try:
            chunk_samples(args.chunk_ms or DEFAULT_CHUNK_MS)
        except ValueError as error:
            parser.error(f"--chunk-ms: {error}")
    args.endpoint_rules = _endpoint_rules(parser, args)
    if args.output_format in SUBTITLE_FORMATS and len(args.audio) > 1 and args.output_dir is None:
        parser.error(f"--format {args.output_format}: subtitles hold one audio file; give --output-dir DIR to "
                     f"write one {args.output_format} file per audio file")
    if args.output_dir is not None:
        names = [_output_name(path, args.output_format) for path in args.audio]
        clash = next((name for name in names if names.count(name) > 1), None)
        if clash:
            parser.error(f"--output-dir: two audio files would both write {args.output_dir / clash}")
    return args


def _endpoint_rules(parser: argparse.ArgumentParser, args: argparse.Namespace) -> EndpointRules | None:
    """``--endpoints``' rules, the defaults where no flag sets them; None without ``--endpoints``."""
    flags = {"silence_after_speech": "--endpoint-silence-after-speech",
             "silence_without_speech": "--endpoint-silence-without-speech", "max_segment": "--max-segment",
             "reset_encoder": "--endpoint-reset-encoder"}
    given = {name: getattr(args, flag[2:].replace("-", "_")) for name, flag in flags.items()}
    given = {name: value for name, value in given.items() if value not in (None, False)}
    if args.stream and args.pause_seconds:  # a stream cut at its pauses: the pause endpoint (offline: Windowing)
        given["pause_seconds"] = args.pause_seconds
    if not args.endpoints:
        if set(given) - {"pause_seconds"}:
            parser.error(f"{flags[next(iter(set(given) - {'pause_seconds'}))]}: an endpoint setting; add --endpoints")
        if not given:
            return None
        given["blank_rules"] = False  # --split-at-pauses alone: the pauses (and the longest segment) cut the stream
    try:
        return EndpointRules(**given)
    except ValueError as error:
        parser.error(str(error))


def _output_name(path: str, output_format: str) -> str:
    return f"{Path(path).stem}.{EXTENSIONS[output_format]}"


class Output:
    """Where each file's segments go as they are ready: stdout (``text`` and ``tsv`` line by line, ``json`` and
    subtitles once complete), or ``--output-dir``, one file per audio file (each replaced only once written)."""

    def __init__(self, args: argparse.Namespace):
        self.format, self.words, self.directory = args.output_format, args.timestamps, args.output_dir
        self.held: list[FileSegments] = []
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        elif self.format == "tsv":
            print(format_tsv([], self.words), end="", flush=True)  # the header

    def add(self, path: str, segments: list[Segment]) -> None:
        if self.directory is not None:
            with replacing(self.directory / _output_name(path, self.format)) as temporary:
                temporary.write_text(format_files([(path, segments)], self.format, self.words), encoding="utf-8")
        elif self.format == "text":
            print(format_files([(path, segments)], "text", self.words), end="", flush=True)
        elif self.format == "tsv":
            print(format_tsv([(path, segments)], self.words, header=False), end="", flush=True)
        else:
            self.held.append((path, segments))

    def close(self) -> None:
        if self.held:
            print(format_files(self.held, self.format, self.words), end="", flush=True)


def load_recognizer(args: argparse.Namespace) -> Recognizer:
    """The ``Recognizer`` the command line asks for: every ``DecodingOptions`` field from its flag."""
    from ..asr.recognizer import Recognizer
    options = {field.name: getattr(args, field.name) for field in fields(DecodingOptions)}
    recognizer = Recognizer(args.checkpoint, data_dir=args.data_dir, device="cpu" if args.cpu else None, **options)
    if args.compile:
        recognizer.model.compile_encoder_layers()
    return recognizer


def _file_segments(text: str, words: list, duration: float, rules: EndpointRules | None,
                   timestamps: bool, frame_seconds: float) -> list[Segment]:
    """An offline transcript -> its segments: one, ``[0, duration]``, or those ``rules`` cut (``split_words``, at the
    model's ``frame_seconds`` per encoder frame); the words kept with ``timestamps`` only."""
    segments = [Segment(0.0, duration, text, words)] if rules is None else \
        split_words(words, duration, rules, text, frame_seconds=frame_seconds)
    return segments if timestamps else [segment._replace(words=[]) for segment in segments]


def transcribe_files(args: argparse.Namespace) -> None:
    """Offline: every file checked, then decoded in batches; the outputs written in input order."""
    import soundfile

    recognizer = load_recognizer(args)
    start = time.perf_counter()
    timed = args.timestamps or args.endpoint_rules is not None  # endpoints cut between timed words
    texts = recognizer.transcribe(args.audio, timestamps=timed)
    output = Output(args)
    for path, transcript in zip(args.audio, texts):
        info = soundfile.info(path)
        text, words = transcript if timed else (transcript, [])
        output.add(path, _file_segments(text, words, info.frames / info.samplerate, args.endpoint_rules,
                                        args.timestamps, recognizer.frame_seconds))
    output.close()
    logger.info(f"transcribed {len(texts)} files in {time.perf_counter() - start:.1f} s")


def stream_files(args: argparse.Namespace) -> None:
    """``--stream``: every file checked before the model loads, then streamed in ``--chunk-ms`` chunks, one after
    the other, through one stream; partial transcripts to stderr."""
    from ..asr.offline import file_frames

    file_frames(args.audio)
    stream = load_recognizer(args).stream(args.timestamps, args.endpoint_rules)
    chunk_ms, start = args.chunk_ms or DEFAULT_CHUNK_MS, time.perf_counter()
    output = Output(args)
    for path in args.audio:
        def show(seconds: float, text: str, path: str = path) -> None:
            print(f"{path} [{seconds:.2f} s] {text}", file=sys.stderr, flush=True)
        output.add(path, stream.stream_file_segments(path, chunk_ms, show))
    output.close()
    logger.info(f"streamed {len(args.audio)} files in {chunk_ms:g} ms chunks in {time.perf_counter() - start:.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr, force=True)  # force: importing fairseq configured logging already
    if args.onnx is not None:
        from ..deploy.transcribe import run  # numpy and onnxruntime, no torch
        return run(args, Output(args))
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
