"""Word timestamps against known word boundaries: start and end errors of each timing rule, per model.

The mini corpus is synthetic speech whose word boundaries the synthesiser reports
(``scripts/mini_word_boundaries.py`` writes them, ``recipes/librispeech/mini/word_boundaries/SUBSET.tsv``). For each
model this decodes every utterance of the chosen subsets offline (``Recognizer.transcribe``, in batches)
and, for a causal model, streamed (``Stream.stream_file``, 320 ms chunks), keeps the alignment the recognizer
timed its words from (units, emission frames, duration: what ``Recognizer.timed_words`` was given), and times the
words by each rule:

* ``emission``: a word spans its units' emission frames (``word_timestamps.emission_times``, the rule before
  issue 50);
* ``aligned``: the emission frames and the blank frames around them (``word_timestamps.aligned_times``, what
  ``word_timestamps`` gives), at its default lead and tail, and at each ``--sweep`` setting.

Hypothesis words are paired with reference words by a word-level alignment of the two transcripts (difflib's
longest matching blocks); only words recognised correctly are scored, and a start (end) only where the reference
knows it (``-`` inside a group of words espeak-ng read as one). Errors are ``|hypothesis - reference|`` in ms:
the median and the 90th percentile over the scored words, and the median signed error (positive: late).

Run from the repository root::

    python scripts/benchmarks/word_timestamps.py                      # both mini models, test-mini and test-large
    python scripts/benchmarks/word_timestamps.py --subsets dev-mini --sweep   # choose the lead and tail on dev

Decoded alignments are kept in ``--alignments FILE`` (JSON) when given, and read back from it on the next run, so
that a sweep does not decode again. The recognisers decode with their default search (beam 4).
"""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import NamedTuple, Sequence

import soundfile as sf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from mini_word_boundaries import WordBoundary, read_boundaries  # noqa: E402

from ssm_fairseq.asr.search.word_timestamps import (  # noqa: E402
    LEAD_FRAMES, TAIL_FRAMES, TimedWord, aligned_times, emission_times, emitted_words)

MODELS = [  # the mini recipe's trained models on the machine these results were measured on
    "mini_streaming (causal)=/work/models/mini_streaming/checkpoints/mssm_transducer_streaming/checkpoint_avg3.pt",
    "mini (bidirectional)=/work/models/mini/checkpoints/mssm_transducer/checkpoint_avg3.pt",
]
CHUNK_MS = 320


class Alignment(NamedTuple):
    """What ``Recognizer.timed_words`` was given for one utterance: units, their emission frames, the audio's
    seconds, and the seconds per encoder frame."""

    units: list[str]
    frames: list[int]
    duration: float
    frame_seconds: float


def decode(checkpoint: str, paths: dict[str, Path], streamed: bool) -> dict[str, Alignment] | None:
    """Each utterance's alignment, decoded offline in batches (``streamed``: one 320 ms stream per file; None for
    a model that cannot stream)."""
    from ssm_fairseq.asr import Recognizer

    recognizer = Recognizer(checkpoint, device="cpu")
    if streamed and recognizer.streaming_problem():
        logging.info("%s: not streamed: %s", checkpoint, recognizer.streaming_problem())
        return None
    captured: list[Alignment] = []
    timed_words = recognizer.timed_words
    dropped = set(recognizer.generator.symbols_to_strip_from_output) | {recognizer.dictionary.eos()}  # as it drops

    def capturing(tokens, frames, duration=None, *args, **kwargs):
        kept = [(int(t), int(f)) for t, f in zip(tokens, frames) if int(t) not in dropped]
        captured.append(Alignment([recognizer.dictionary[t] for t, _ in kept], [f for _, f in kept], duration,
                                  recognizer.frame_seconds))
        return timed_words(tokens, frames, duration, *args, **kwargs)

    recognizer.timed_words = capturing  # this instance only: both paths call it with what they time
    utterances = sorted(paths)
    if streamed:
        stream = recognizer.stream(timestamps=True)
        transcripts = []
        for n, utterance in enumerate(utterances, 1):
            transcripts.append(stream.stream_file(paths[utterance], CHUNK_MS))
            if n % 100 == 0:
                logging.info("streamed: %d/%d", n, len(utterances))
    else:  # in batches, as ssm-transcribe decodes files; timed_words is called in the batches' order
        transcripts = recognizer.transcribe([paths[u] for u in utterances], timestamps=True)
    if len(captured) != len(utterances):
        raise RuntimeError(f"timed_words was called {len(captured)} times for {len(utterances)} files")
    timed = [aligned_times(emitted_words(a.units, a.frames), a.frame_seconds, a.duration) for a in captured]
    alignments = {}
    for utterance, transcript in zip(utterances, transcripts):
        # the alignment of this file's duration whose words are this file's: one, or several equal ones
        info = sf.info(str(paths[utterance]))
        matches = {json.dumps(captured[i]) for i, words in enumerate(timed)
                   if words == transcript.words and captured[i].duration == info.frames / info.samplerate}
        if len(matches) != 1:
            raise RuntimeError(f"{paths[utterance]}: {len(matches)} alignments give this file's words")
        alignments[utterance] = Alignment(*json.loads(matches.pop()))
    return alignments


def paired_errors(hypothesis: Sequence[TimedWord], reference: Sequence[WordBoundary]
                  ) -> tuple[list[float], list[float]]:
    """Signed start and end errors in ms of the correctly recognised words (difflib's matching blocks)."""
    starts, ends = [], []
    matcher = difflib.SequenceMatcher(None, [w.word.upper() for w in hypothesis],  # the models write lower case
                                      [w.word.upper() for w in reference], autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            hyp, ref = hypothesis[block.a + k], reference[block.b + k]
            if ref.start is not None:
                starts.append(1000 * (hyp.start - ref.start))
            if ref.end is not None:
                ends.append(1000 * (hyp.end - ref.end))
    return starts, ends


def summary(errors: list[float]) -> str:
    """``median | 90th percentile | signed median`` of the absolute errors in ms."""
    if not errors:
        return "- | - | -"
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, int(round(0.9 * (len(absolute) - 1))))]
    return f"{statistics.median(absolute):.0f} | {p90:.0f} | {statistics.median(errors):+.0f}"


def score(alignments: dict[str, Alignment], references: dict[str, list[WordBoundary]], lead: int | None,
          tail: int | None) -> tuple[list[float], list[float], int]:
    """Start and end errors over all utterances of one rule (``lead`` None: ``emission``), and the words
    scored."""
    starts, ends, words = [], [], 0
    for utterance, alignment in alignments.items():
        emitted = emitted_words(alignment.units, alignment.frames)
        timed = (emission_times(emitted, alignment.frame_seconds, alignment.duration) if lead is None else
                 aligned_times(emitted, alignment.frame_seconds, alignment.duration, lead, tail))
        s, e = paired_errors(timed, references[utterance])
        starts += s
        ends += e
        words += len(timed)
    return starts, ends, words


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / "recipes/librispeech/mini/LibriSpeech")
    parser.add_argument("--boundaries", type=Path, default=ROOT / "recipes/librispeech/mini/word_boundaries",
                        help="SUBSET.tsv of scripts/mini_word_boundaries.py")
    parser.add_argument("--subsets", nargs="+", default=["test-mini", "test-large"])
    parser.add_argument("--models", nargs="+", default=MODELS, metavar="NAME=CHECKPOINT",
                        help="speech_transducer checkpoints (default: the two mini models of /work/models)")
    parser.add_argument("--alignments", type=Path, default=None, help="JSON cache of the decoded alignments")
    parser.add_argument("--sweep", action="store_true", help="also every lead of 0-12 and tail of 0-8 frames")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    cache = json.loads(args.alignments.read_text()) if args.alignments and args.alignments.exists() else {}
    rules: list[tuple[str, int | None, int | None]] = [("emission", None, None),
                                                       (f"aligned {LEAD_FRAMES}/{TAIL_FRAMES}", LEAD_FRAMES,
                                                        TAIL_FRAMES)]
    if args.sweep:
        rules += [(f"aligned {lead}/{tail}", lead, tail) for lead in range(13) for tail in range(9)]
    print("| model | subset | decoding | rule (lead/tail frames) | words scored / timed | start: median | p90 | "
          "signed median (ms) | end: median | p90 | signed median (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name_checkpoint in args.models:
        model, separator, checkpoint = name_checkpoint.partition("=")
        if not separator or not Path(checkpoint).is_file():
            parser.error(f"--models: NAME=CHECKPOINT with an existing checkpoint expected, got {name_checkpoint!r}")
        for subset in args.subsets:
            references = read_boundaries(args.boundaries / f"{subset}.tsv")
            paths = {u: args.corpus / subset / u.split("-")[0] / u.split("-")[1] / f"{u}.flac" for u in references}
            for streamed in (False, True):
                key = f"{model}|{subset}|{'streamed' if streamed else 'offline'}"
                if key not in cache:
                    decoded = decode(checkpoint, paths, streamed)
                    cache[key] = None if decoded is None else {u: a._asdict() for u, a in decoded.items()}
                    if args.alignments:
                        args.alignments.write_text(json.dumps(cache))
                if cache[key] is None:
                    continue
                alignments = {u: Alignment(**a) for u, a in cache[key].items()}
                for name, lead, tail in rules:
                    starts, ends, words = score(alignments, references, lead, tail)
                    print(f"| {model} | {subset} | {key.rsplit('|', 1)[1]} | {name} | {len(ends)} / {words} | "
                          f"{summary(starts)} | {summary(ends)} |", flush=True)


if __name__ == "__main__":
    main()
