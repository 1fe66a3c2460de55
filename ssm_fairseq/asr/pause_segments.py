"""Where a recording pauses: speech segments cut at quiet stretches of the audio, for offline transcription.

The transducers of this package are trained on single sentences; given several sentences in one recording, they
delete whole sentences (issue 50: 85% WER on joined test utterances against 18.5% one at a time). Cut where the
speaker pauses, each piece is again about one sentence, and decoded as one, it transcribes as the sentences do
alone. The cut is made from the audio's energy, before any decoding, so it does not depend on what the model
hears (``endpoints`` cuts from the search's blank frames instead, which is what a live stream has).

A filterbank frame's level is the log of its summed Mel energies, in dB (``frame_levels_db``). Over a file the
levels have a floor (the 10th percentile: pauses, breaths, background) and a speech level (the 90th); a frame is
quiet when it is below ``floor + QUIET_SHARE x (speech - floor)``. A pause is a run of at least ``min_pause``
seconds of quiet frames (at the file's start and end too); pauses are not decoded, and each stretch between them
is a segment, with ``KEPT_QUIET_SECONDS`` of the pause on each side. A file whose levels span less than
``MIN_DYNAMIC_RANGE_DB`` (all noise, or speech with no quiet frames) has no pause: one segment. A stretch longer
than ``max_frames`` without a pause is cut at its quietest frame (a moving mean over 0.2 s), again until every
segment fits: a segment is then one utterance the encoder takes whole.

Why no quiet is kept around a segment: with the mini recipe's streaming model (``checkpoint_avg3.pt``, beam 4) on
the 60 test-mini utterances joined chapter by chapter with 1 s pauses of faint noise, the WER was 31.0% with the
segments cut at the pauses' edges, 44.0%, 44.8% and 46.3% with 0.03, 0.05 and 0.1 s of the pause kept on each side,
and 51.2% cut at the pauses' middles (24.8% for the utterances one at a time, 87.0% for the recordings whole): the
mini corpus's utterances begin at their first sound, and the model, which never heard a quiet start, writes words
into one. One model and one corpus: a model trained on utterances with silence around them may want some kept.

A stream has no whole file: ``CausalQuietness`` applies the same test to each frame as it arrives, with the floor
and speech levels of the levels seen so far (the last ``CAUSAL_WINDOW_SECONDS``, the frame included), so a frame's
verdict never changes with what follows and does not depend on how the stream is chunked. Until the levels seen
span ``MIN_DYNAMIC_RANGE_DB`` (a stream's first sentence, before its first pause), no frame is quiet: a pause at a
stream's very start is fed to the model, where a file's would be dropped. ``Stream`` cuts at such pauses
(``EndpointRules.pause_seconds``).

Pure numpy (no torch).
"""
from __future__ import annotations

import math

import numpy as np

FRAMES_PER_SECOND = 100  # filterbank frames (10 ms shift)
FLOOR_PERCENTILE, SPEECH_PERCENTILE = 10, 90
QUIET_SHARE = 0.3  # of the way from the floor up to the speech level: below, a frame is quiet
MIN_DYNAMIC_RANGE_DB = 10.0  # levels that span less: no pause can be told from speech
QUIETEST_SMOOTHING = 20  # frames (0.2 s) averaged when a long stretch is cut at its quietest point
KEPT_QUIET_SECONDS = 0.0  # of a pause, kept on each side of the segments around it (measured: module docstring)
DB_PER_NEPER = 10 / math.log(10)
CAUSAL_WINDOW_SECONDS = 60.0  # a stream's floor and speech levels: over at most this much of its latest audio


def frame_levels_db(fbank: np.ndarray) -> np.ndarray:
    """``T x M`` log-Mel filterbank frames -> ``T`` levels in dB (10 log10 of each frame's summed Mel energies)."""
    fbank = np.asarray(fbank, dtype=np.float64)
    peak = fbank.max(axis=1, keepdims=True)
    return DB_PER_NEPER * (peak[:, 0] + np.log(np.exp(fbank - peak).sum(axis=1)))


def quiet_frames(levels: np.ndarray) -> np.ndarray:
    """Which frames of ``levels`` (dB) are quiet (see the module docstring): a boolean array, all False where the
    levels span less than ``MIN_DYNAMIC_RANGE_DB``."""
    if not len(levels):
        return np.zeros(0, dtype=bool)
    floor, speech = np.percentile(levels, [FLOOR_PERCENTILE, SPEECH_PERCENTILE])
    if speech - floor < MIN_DYNAMIC_RANGE_DB:
        return np.zeros(len(levels), dtype=bool)
    return levels < floor + QUIET_SHARE * (speech - floor)


def pauses(quiet: np.ndarray, min_frames: int) -> list[tuple[int, int]]:
    """The runs ``[start, end)`` of at least ``min_frames`` quiet frames, in order."""
    edges = np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(int(s), int(e)) for s, e in zip(starts, ends) if e - s >= min_frames]


def speech_segments(levels: np.ndarray, min_pause: float, max_frames: int) -> list[tuple[int, int]]:
    """The segments ``[start, end)`` of a file's frames ``[0, len(levels))`` between its pauses of at least
    ``min_pause`` seconds, in order, each with ``KEPT_QUIET_SECONDS`` of its pauses and cut at its quietest frames
    into pieces of at most ``max_frames`` (see the module docstring); none if the file is one pause. ``ValueError``
    for a ``min_pause`` that is not positive or a ``max_frames`` under 2 frames."""
    if not min_pause > 0:
        raise ValueError(f"the shortest pause to cut at must be a positive number of seconds, got {min_pause!r}")
    if max_frames < 2:
        raise ValueError(f"segments must be allowed at least 2 frames, got {max_frames}")
    kept = round(KEPT_QUIET_SECONDS * FRAMES_PER_SECOND)
    found = pauses(quiet_frames(levels), math.ceil(min_pause * FRAMES_PER_SECOND))
    starts = [0] + [end - kept for _, end in found]
    ends = [start + kept for start, _ in found] + [len(levels)]
    segments: list[tuple[int, int]] = []
    for start, end in zip(starts, ends):
        if end > start:  # not the empty stretch before a pause at the file's start or after one at its end
            segments += _fitted(levels, max(start, 0), min(end, len(levels)), max_frames)
    return segments


def _fitted(levels: np.ndarray, start: int, end: int, max_frames: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into segments of at most ``max_frames``: each cut at the quietest frame between half a
    segment and a whole one after the previous cut, leaving at least half a segment."""
    first = start
    smoothed = np.convolve(levels[first:end], np.ones(QUIETEST_SMOOTHING) / QUIETEST_SMOOTHING, mode="same")
    segments = []
    while end - start > max_frames:
        # the piece cut off, and what remains, at least half a segment long; the piece at most a whole one
        low, high = start + max_frames // 2, min(start + max_frames, end - max_frames // 2)
        cut = low + int(np.argmin(smoothed[low - first:high - first + 1]))
        segments.append((start, cut))
        start = cut
    return [*segments, (start, end)]


class CausalQuietness:
    """``quiet_frames`` for a stream, frame by frame: a frame is quiet when its level is below
    ``floor + QUIET_SHARE x (speech - floor)`` of the levels seen so far (at most the last ``window_frames``,
    the frame's own included), none while they span less than ``MIN_DYNAMIC_RANGE_DB``."""

    def __init__(self, window_frames: int = round(CAUSAL_WINDOW_SECONDS * FRAMES_PER_SECOND)):
        if window_frames < 1:
            raise ValueError(f"the window of levels must hold at least one frame, got {window_frames}")
        self.window_frames = window_frames
        self.levels = np.zeros(0, dtype=np.float64)  # the last window_frames levels seen (dB)

    def quiet(self, fbank: np.ndarray) -> np.ndarray:
        """The next ``T x M`` log-Mel frames of the stream -> ``T`` booleans: which are quiet."""
        verdicts = np.zeros(len(fbank), dtype=bool)
        for index, level in enumerate(frame_levels_db(fbank) if len(fbank) else []):
            self.levels = np.append(self.levels[len(self.levels) + 1 - self.window_frames:], level)
            floor, speech = np.percentile(self.levels, [FLOOR_PERCENTILE, SPEECH_PERCENTILE])
            verdicts[index] = speech - floor >= MIN_DYNAMIC_RANGE_DB and level < floor + QUIET_SHARE * (speech - floor)
        return verdicts
