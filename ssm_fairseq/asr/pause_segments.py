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

Where a piece starts and ends. The frames at a pause's edges are judged on their samples as well as their level,
so that a piece starts and ends where its sound does, as the training utterances did:

- digital silence (a frame whose samples are all zero: ``10 log10(M x float32 eps)`` dB, -50.2 for 80 Mel bins,
  below ``DIGITAL_SILENCE_DB``) is a clip's margin, not a pause, for its first ``DIGITAL_MARGIN_SECONDS``: those
  frames of a run of it are never quiet, the rest of the run is (a pause that is digital silence still cuts, its
  first frames kept with the piece before it). A recording assembled from clips (synthesized or edited speech,
  each clip beginning and ending in zero samples, room noise between them) is cut at the clips' own edges;
- given the frames' samples (``window``), a frame that is not quiet right after a quiet one, whose window's first
  shift (10 ms) is ``FAINT_DB`` below the whole window and not all zeros (``starts_in_pause``), is quiet
  (``pause_ends_quiet``), and so on: the piece starts at the first frame whose first shift holds its sound (or its
  clip's zeros): at most 10 ms of the pause before the sound, where the level test left up to 25 ms.

Why: the mini corpus's utterances (eSpeak NG, 8-bit) begin with 0 to 848 zero samples and end with 750 to 955, and
the length of the leading run carries the first sound (a plosive's closure, rounded to zeros, is long): the causal
model reads what comes before the first sound. Cut at the first frame that is not quiet, a piece after a pause of
faint noise began with 15-25 ms of the pause whatever the sound, and the sentences' first words went wrong
(aligned utterance by utterance, test-mini joined with 1 s pauses: 52 word errors before the first correct word
against 12 decoded one at a time, while the middles and ends had 39 and 31 against 49 and 36; no piece merged or
split utterances; 31.2% against 24.8% WER). Started at their files' first samples (known from how the recordings
were made), the pieces gave the utterances' own WER (24.8% test-mini, 23.3% test-large); with 5 frames of
digital silence put before each piece instead, 46.0% (the model reads any longer lead as a plosive: "peter"). The
margin rule alone gave 26.3% (test-mini) and 26.6% (test-large, 0.3 s pauses); with the first-shift rule, 24.81%
and 23.23%, the utterances' own (mini streaming model, beam 4, ``scripts/benchmarks/long_file_offline.py``). In
a recording without zero samples only the second rule acts, and only where a pause is ``FAINT_DB`` below the sound
that ends it.

A stream has no whole file: ``CausalQuietness`` applies the same test to each frame as it arrives, with the floor
and speech levels of the levels seen so far (the last ``CAUSAL_WINDOW_SECONDS``, the frame included), so a frame's
verdict never changes with what follows and does not depend on how the stream is chunked (the edge rules too: a
run of digital silence is counted on across calls, and given the stream's samples, ``quiet(fbank, samples)``, a
frame's window is kept until the frame is judged). Until the levels seen span ``MIN_DYNAMIC_RANGE_DB`` (a stream's
first sentence, before its first pause), no frame is quiet: a pause at a stream's very start is fed to the model,
where a file's would be dropped. ``Stream`` cuts at such pauses (``EndpointRules.pause_seconds``), its samples
given.

Pure numpy (no torch).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

FRAMES_PER_SECOND = 100  # filterbank frames (10 ms shift)
FLOOR_PERCENTILE, SPEECH_PERCENTILE = 10, 90
QUIET_SHARE = 0.3  # of the way from the floor up to the speech level: below, a frame is quiet
MIN_DYNAMIC_RANGE_DB = 10.0  # levels that span less: no pause can be told from speech
QUIETEST_SMOOTHING = 20  # frames (0.2 s) averaged when a long stretch is cut at its quietest point
KEPT_QUIET_SECONDS = 0.0  # of a pause, kept on each side of the segments around it (measured: module docstring)
DB_PER_NEPER = 10 / math.log(10)
CAUSAL_WINDOW_SECONDS = 60.0  # a stream's floor and speech levels: over at most this much of its latest audio
# A frame of zero samples is 10 log10(M x float32 eps) dB: -50.2 for M = 80 Mel bins, -55.6 for 23, -48.2 for 128;
# one 16-bit step anywhere in the 25 ms window gives -42 dB or more.
DIGITAL_SILENCE_DB = -45.0
DIGITAL_MARGIN_SECONDS = 0.05  # of a run of digital silence, a clip's margin: never quiet (module docstring)
DIGITAL_MARGIN_FRAMES = round(DIGITAL_MARGIN_SECONDS * FRAMES_PER_SECOND)
FAINT_DB = 30.0  # a window's first shift this far below the whole window: the window starts before the sound
WINDOW_SAMPLES, SHIFT_SAMPLES = 400, 160  # a filterbank frame's window and shift at 16 kHz

FrameWindow = Callable[[int], np.ndarray]  # frame i -> its window's 16 kHz samples [160 i, 160 i + 400)


def frame_levels_db(fbank: np.ndarray) -> np.ndarray:
    """``T x M`` log-Mel filterbank frames -> ``T`` levels in dB (10 log10 of each frame's summed Mel energies)."""
    fbank = np.asarray(fbank, dtype=np.float64)
    peak = fbank.max(axis=1, keepdims=True)
    return DB_PER_NEPER * (peak[:, 0] + np.log(np.exp(fbank - peak).sum(axis=1)))


def silent_runs(levels: np.ndarray, run_before: int = 0) -> np.ndarray:
    """``T`` levels (dB) -> ``T`` ints: how many frames of digital silence (below ``DIGITAL_SILENCE_DB``) end at each
    frame, the frame included (0 for a frame that is not digital silence); ``run_before``: the run that ended the
    frames before these (a stream's last call)."""
    levels = np.asarray(levels)
    index = np.arange(len(levels))
    last_sound = np.maximum.accumulate(np.where(levels < DIGITAL_SILENCE_DB, -1, index)) if len(levels) else index
    return np.where(last_sound >= 0, index - last_sound, index + 1 + run_before)


def quiet_frames(levels: np.ndarray) -> np.ndarray:
    """Which frames of ``levels`` (dB) are quiet (see the module docstring): a boolean array, all False where the
    levels span less than ``MIN_DYNAMIC_RANGE_DB``; the first ``DIGITAL_MARGIN_FRAMES`` of a run of digital silence
    never."""
    if not len(levels):
        return np.zeros(0, dtype=bool)
    floor, speech = np.percentile(levels, [FLOOR_PERCENTILE, SPEECH_PERCENTILE])
    if speech - floor < MIN_DYNAMIC_RANGE_DB:
        return np.zeros(len(levels), dtype=bool)
    runs = silent_runs(levels)
    margin = (runs >= 1) & (runs <= DIGITAL_MARGIN_FRAMES)
    return (levels < floor + QUIET_SHARE * (speech - floor)) & ~margin


def starts_in_pause(window: np.ndarray) -> bool:
    """Whether a frame's window of samples (sound in it: the frame is not quiet) starts in the pause before the
    sound: its first shift (``SHIFT_SAMPLES``) holds a non-zero sample (not a clip's digital silence) and is
    ``FAINT_DB`` or more below the whole window (the sound starts after it)."""
    head = np.asarray(window[:SHIFT_SAMPLES], dtype=np.float64)
    if not head.any():
        return False
    whole = np.mean(np.square(window, dtype=np.float64))
    return bool(np.mean(head ** 2) <= whole * 10 ** (-FAINT_DB / 10))


def pause_ends_quiet(quiet: np.ndarray, window: FrameWindow, before: bool = False) -> np.ndarray:
    """``quiet`` with the frames whose windows start in a pause also quiet: a frame that is not quiet, after one that
    is (``before``: the frame before ``quiet[0]``, for a stream), whose window starts in the pause
    (``starts_in_pause``), and so on while the next frame's does too. So a piece starts at the first frame whose
    window's first shift holds its sound or its clip's digital silence (module docstring)."""
    quiet = quiet.copy()
    for index in np.flatnonzero(np.r_[before, quiet[:-1]] & ~quiet).tolist():  # a pause's end
        while index < len(quiet) and not quiet[index] and starts_in_pause(window(index)):
            quiet[index] = True
            index += 1
    return quiet


def pauses(quiet: np.ndarray, min_frames: int) -> list[tuple[int, int]]:
    """The runs ``[start, end)`` of at least ``min_frames`` quiet frames, in order."""
    edges = np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(int(s), int(e)) for s, e in zip(starts, ends) if e - s >= min_frames]


def speech_segments(levels: np.ndarray, min_pause: float, max_frames: int, window: FrameWindow | None = None
                    ) -> list[tuple[int, int]]:
    """The segments ``[start, end)`` of a file's frames ``[0, len(levels))`` between its pauses of at least
    ``min_pause`` seconds, in order, each with ``KEPT_QUIET_SECONDS`` of its pauses and cut at its quietest frames
    into pieces of at most ``max_frames`` (see the module docstring); none if the file is one pause. ``window``:
    frame i's samples, to start the pieces where clips start (``pause_ends_quiet``; None: not looked at).
    ``ValueError`` for a ``min_pause`` that is not positive or a ``max_frames`` under 2 frames."""
    if not min_pause > 0:
        raise ValueError(f"the shortest pause to cut at must be a positive number of seconds, got {min_pause!r}")
    if max_frames < 2:
        raise ValueError(f"segments must be allowed at least 2 frames, got {max_frames}")
    kept = round(KEPT_QUIET_SECONDS * FRAMES_PER_SECOND)
    quiet = quiet_frames(levels)
    if window is not None:
        quiet = pause_ends_quiet(quiet, window)
    found = pauses(quiet, math.ceil(min_pause * FRAMES_PER_SECOND))
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
        self.silent_run = 0  # frames of digital silence that ended the frames seen (``silent_runs``)
        self.last_quiet = False  # the verdict of the last frame seen
        self.samples = np.zeros(0, dtype=np.float32)  # from the next frame's window's start on (``samples`` given)

    def quiet(self, fbank: np.ndarray, samples: np.ndarray | None = None) -> np.ndarray:
        """The next ``T x M`` log-Mel frames of the stream -> ``T`` booleans: which are quiet. ``samples``: the 16 kHz
        samples these frames were made from (those after the last call's, as given to the filterbank), to start the
        pieces where clips start (``pause_ends_quiet``); None on every call: not looked at."""
        if samples is not None:
            self.samples = np.concatenate([self.samples, np.asarray(samples, dtype=np.float32).reshape(-1)])
        verdicts = np.zeros(len(fbank), dtype=bool)
        if not len(fbank):
            return verdicts
        levels = frame_levels_db(fbank)
        runs = silent_runs(levels, self.silent_run)
        self.silent_run = int(runs[-1])
        for index, level in enumerate(levels):
            self.levels = np.append(self.levels[len(self.levels) + 1 - self.window_frames:], level)
            floor, speech = np.percentile(self.levels, [FLOOR_PERCENTILE, SPEECH_PERCENTILE])
            margin = 1 <= runs[index] <= DIGITAL_MARGIN_FRAMES
            verdicts[index] = (speech - floor >= MIN_DYNAMIC_RANGE_DB and level < floor + QUIET_SHARE * (speech - floor)
                               and not margin)
        if samples is not None:
            verdicts = pause_ends_quiet(verdicts, lambda i: self.samples[i * SHIFT_SAMPLES:i * SHIFT_SAMPLES +
                                                                          WINDOW_SAMPLES], self.last_quiet)
            self.samples = self.samples[len(fbank) * SHIFT_SAMPLES:]
        self.last_quiet = bool(verdicts[-1])
        return verdicts
