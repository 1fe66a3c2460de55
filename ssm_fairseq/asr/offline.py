"""Offline transcription of audio files with a ``Recognizer``: every file checked first, then decoded in padded
batches as ``fairseq-generate`` batches and decodes a manifest; files longer than one window of ``Windowing``
(30 s by default) one at a time, window by window, in bounded memory (``long_form``). With ``Windowing``'s
``pause_seconds``, every file is instead cut where it pauses (``pause_segments``) and its pieces decoded as
utterances, in padded batches (``transcribe_at_pauses``).

Files up to the window's length are sorted by length (longest first) and cut into batches of at most ``max_tokens``
frames (and ``batch_size`` files); each batch is padded with zeros after each end, as fairseq's collater pads, and
decoded by the task's ``TransducerGenerator``. So such a file gives the ``D-`` hypothesis ``fairseq-generate`` prints
for its features with the same search options and batches. A longer file has no length limit: its encoder output is
made window by window and searched as one (``long_form.transcribe_long``).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import soundfile as sf
import torch
from fairseq.data import data_utils
from torch.nn.utils.rnn import pad_sequence

from .features.audio_features import (FRAME_SHIFT_SAMPLES, MIN_SAMPLES, SAMPLE_RATE, AudioError, Conversions,
                                      audio_frames)
from .features.audio_spans import AudioSpans
from .long_form import transcribe_long, window_frames
from .pause_segments import frame_levels_db, speech_segments
from .search.transducer_generator import NonFiniteScoreError
from .search.word_timestamps import TimedWord
from .transcripts import InputError, Segment, TimedTranscript, joined
from .windowing import FRAMES_PER_SECOND, Windowing

if TYPE_CHECKING:
    from .recognizer import Recognizer

logger = logging.getLogger("ssm_fairseq.transcribe")

TooLong = Callable[[Path | str, int], "str | None"]  # (path, feature frames) -> what to do, or None if it fits
LEVEL_BLOCK_FRAMES = 6000  # filterbank frames read at a time (60 s) to find where a file pauses


def file_frames(paths: Sequence[Path | str], too_long: TooLong | None = None) -> list[int]:
    """Feature frames of every file (from its header), or ``InputError`` listing every file that is missing,
    unreadable or empty, and every one ``too_long`` has something to say about."""
    frames, problems = [], []
    for path in paths:
        try:
            frames.append(audio_frames(path))
        except AudioError as error:
            problems.append(str(error))
            continue
        problem = None if too_long is None else too_long(path, frames[-1])
        if problem:
            problems.append(problem)
    if problems:
        raise InputError(problems)
    return frames


def transcribe_files(recognizer: Recognizer, paths: Sequence[Path | str], timestamps: bool,
                     windowing: Windowing = Windowing()) -> list[str] | list[TimedTranscript]:
    """``Recognizer.transcribe``: the transcript of each file of ``paths``, in order (``TimedTranscript``s with
    ``timestamps``); files that are not 16 kHz mono are converted and logged, one line per kind of conversion.
    Files longer than ``windowing``'s window are transcribed window by window (``long_form``), after the others."""
    if isinstance(paths, (str, Path)):
        raise TypeError(f"transcribe takes a list of paths, got the single path {paths!r}")
    if timestamps:
        recognizer.check_timestamps()
    if not paths:
        return []
    if windowing.pause_seconds:
        file_frames(paths)  # every file checked before any is decoded
        conversions = Conversions()
        texts = [transcribe_at_pauses(recognizer, path, windowing, timestamps, conversions) for path in paths]
        conversions.log(logger)
        return texts
    window, _, _ = window_frames(recognizer, windowing)
    frames = np.array(file_frames(paths, lambda path, n: None if n > window else too_long(recognizer, path, n)),
                      dtype=np.int64)
    texts: list[str | TimedTranscript | None] = [None] * len(paths)
    conversions = Conversions()
    short = np.flatnonzero(frames <= window)
    _transcribe_batched(recognizer, paths, short, frames, timestamps, conversions, texts)
    for index in np.flatnonzero(frames > window).tolist():
        texts[index] = transcribe_long(recognizer, paths[index], windowing, timestamps, conversions)
    conversions.log(logger)
    return texts


def _transcribe_batched(recognizer: Recognizer, paths: Sequence[Path | str], indices: np.ndarray,
                        frames: np.ndarray, timestamps: bool, conversions: Conversions,
                        texts: list[str | TimedTranscript | None]) -> None:
    """Decode files ``indices`` of ``paths`` (of ``frames`` feature frames each) in padded batches, as
    ``fairseq-generate`` batches a manifest, into ``texts``."""
    if not len(indices):
        return
    order = indices[np.lexsort((indices, -frames[indices]))]  # longest first, as fairseq orders a manifest
    batches = data_utils.batch_by_size(order, num_tokens_fn=frames.__getitem__,
                                       max_tokens=recognizer.options.batch_max_tokens,
                                       max_sentences=recognizer.options.batch_size)
    done, every = 0, max(1, len(batches) // 10)
    for n, batch in enumerate(batches, 1):
        try:
            decoded = _decode(recognizer, batch, [recognizer.features(paths[i], conversions) for i in batch],
                              [_duration(paths[i]) for i in batch] if timestamps else None)
        except NonFiniteScoreError as error:  # sample ids are indices of paths
            raise InputError([f"{paths[i]}: {error.reason}" for i in error.ids]) from error
        for index, text in zip(batch, decoded):
            texts[index] = text
        done += len(batch)
        if n % every == 0 or n == len(batches):
            logger.info(f"{done}/{len(indices)} files transcribed ({n}/{len(batches)} batches)")


def transcribe_at_pauses(recognizer: Recognizer, path: Path | str, windowing: Windowing, timestamps: bool,
                         conversions: Conversions) -> str | TimedTranscript:
    """One file cut where it pauses for at least ``windowing.pause_seconds`` (``pause_segments.speech_segments``;
    pieces at most a window, and a batch, long), each piece decoded as an utterance (its own utterance CMVN) in
    padded batches, longest first; the pieces' transcripts joined by spaces (``TimedTranscript`` with
    ``timestamps``: words timed from the file's start). Memory: the file's frame levels and one batch's features,
    whatever its length. Raises ``AudioError`` or ``InputError`` naming the file."""
    spans = AudioSpans(path)
    conversions.add(path, spans.conversion)
    levels = np.concatenate([frame_levels_db(spans.filterbank(start, min(start + LEVEL_BLOCK_FRAMES, spans.frames)))
                             for start in range(0, spans.frames, LEVEL_BLOCK_FRAMES)])
    window, _, _ = window_frames(recognizer, windowing)
    max_tokens = recognizer.options.batch_max_tokens
    longest = window if max_tokens is None else min(window, max_tokens)
    segments = speech_segments(levels, windowing.pause_seconds, longest,  # the frames' samples: where clips start
                               lambda i: spans.samples(i * FRAME_SHIFT_SAMPLES, i * FRAME_SHIFT_SAMPLES + MIN_SAMPLES))
    lengths = np.array([end - start for start, end in segments], dtype=np.int64)
    batches = data_utils.batch_by_size(np.argsort(-lengths, kind="stable"), num_tokens_fn=lengths.__getitem__,
                                       max_tokens=max_tokens, max_sentences=recognizer.options.batch_size)
    pieces: list = [None] * len(segments)
    every = max(1, len(batches) // 10)
    for n, batch in enumerate(batches, 1):
        features = [recognizer.utterance_features(spans.filterbank(*segments[i]), path, " (seconds "
                                                  f"{segments[i][0] / FRAMES_PER_SECOND:.2f} to "
                                                  f"{segments[i][1] / FRAMES_PER_SECOND:.2f})") for i in batch]
        try:
            decoded = _decode(recognizer, batch, features,  # a piece's audio: to the end of its last frame's window
                              [((lengths[i] - 1) * FRAME_SHIFT_SAMPLES + MIN_SAMPLES) / SAMPLE_RATE for i in batch]
                              if timestamps else None)
        except NonFiniteScoreError as error:
            raise InputError([f"{path}: {error.reason}"]) from error
        for i, piece in zip(batch, decoded):
            pieces[i] = piece
        if len(batches) > 1 and (n % every == 0 or n == len(batches)):
            logger.info(f"{path}: {sum(map(len, batches[:n]))}/{len(segments)} pieces between pauses transcribed")
    if not timestamps:
        return " ".join(piece for piece in pieces if piece)
    return joined([Segment(start / FRAMES_PER_SECOND, end / FRAMES_PER_SECOND, piece.text,
                           [TimedWord(w.word, w.start + start / FRAMES_PER_SECOND, w.end + start / FRAMES_PER_SECOND)
                            for w in piece.words]) for (start, end), piece in zip(segments, pieces)])


def too_long(recognizer: Recognizer, path: Path | str, frames: int) -> str | None:
    """What to do with a file of ``frames`` feature frames, at most a window long, that is longer than a batch may
    be, or None if it fits."""
    max_tokens = recognizer.options.batch_max_tokens
    if max_tokens is not None and frames > max_tokens:
        return (f"{path}: {frames / 100:.1f} s of audio ({frames} feature frames), more than a batch holds "
                f"(max_tokens, --max-tokens {max_tokens}): raise --max-tokens to at least {frames}")
    return None


def _decode(recognizer: Recognizer, ids: Sequence[int], features: list[torch.Tensor],
            durations: list[float] | None = None) -> list[str] | list[TimedTranscript]:
    """The ``T_i x 80`` features of files ``ids`` -> their transcripts, decoded as one ``B x T x 80`` padded batch
    (zeros after each end, longest first, as fairseq's collater pads a batch); with the files' ``durations``
    (seconds), their ``TimedTranscript``s."""
    lengths, order = torch.tensor([f.shape[0] for f in features]).sort(descending=True)
    sample = {"id": torch.tensor(ids)[order], "net_input": {
        "src_tokens": pad_sequence([features[i] for i in order], batch_first=True).to(recognizer.device),
        "src_lengths": lengths.to(recognizer.device)}}
    hypotheses = recognizer.task.inference_step(recognizer.generator, [recognizer.model], sample)
    texts = [""] * len(features)
    for i, best in zip(order.tolist(), hypotheses):
        texts[i] = recognizer.text(best[0]["tokens"])
        if durations is not None:  # the alignment: (encoder frame, token index) per label, </s> not included
            tokens = best[0]["tokens"].tolist()
            aligned = [(frame, tokens[index]) for frame, index in best[0]["alignment"]]
            words = recognizer.timed_words([token for _, token in aligned], [frame for frame, _ in aligned],
                                           durations[i])
            texts[i] = TimedTranscript(texts[i], words)
    return texts


def _duration(path: Path | str) -> float:
    """Seconds of audio in a file (checked readable before), from its header."""
    info = sf.info(str(path))
    return info.frames / info.samplerate
