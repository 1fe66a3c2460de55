"""Where offline transcription cuts a file: ``Windowing`` (window length, context, the scope of utterance CMVN, and
whether to cut at pauses: the ``window_*`` options of ``DecodingOptions`` and ``ssm-transcribe``) and the windows of
a file (``plan_windows``).
Imports no torch; ``long_form`` encodes and searches the windows."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

CMVN_SCOPES = ("window", "file")
FRAMES_PER_SECOND = 100  # filterbank frames (10 ms shift)


@dataclass(frozen=True)
class Windowing:
    """How offline transcription cuts a file longer than one window.

    Args:
        window_seconds: the encoder's input per window (files up to this long are one window: whole-file decoding).
        window_context_seconds: encoder input on each side of a window's centre frames (the frames kept).
        window_cmvn: where utterance CMVN takes its mean and variance on a long file: ``"window"`` (each window's
            own) or ``"file"`` (the whole file's, from a first pass). Per-frame transforms (global CMVN) are exact
            either way.
        pause_seconds: if positive, every file is cut where the audio pauses at least this long, and each piece
            (at most a window long) is decoded as an utterance of its own (``pause_segments``); 0: files up to a
            window long are decoded whole, longer ones in windows.

    Seconds are rounded to whole encoder frames. Raises ``ValueError`` naming the first argument out of range.
    """

    window_seconds: float = 30.0
    window_context_seconds: float = 4.0
    window_cmvn: str = "window"
    pause_seconds: float = 0.0

    def __post_init__(self):
        for name in ("window_seconds", "window_context_seconds", "pause_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        for name in ("window_context_seconds", "pause_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.window_seconds <= 2 * self.window_context_seconds:
            raise ValueError(f"window_seconds ({self.window_seconds}) must be more than twice "
                             f"window_context_seconds ({self.window_context_seconds}): each window keeps its centre "
                             "between the two contexts")
        if self.window_cmvn not in CMVN_SCOPES:
            raise ValueError(f"window_cmvn must be one of {CMVN_SCOPES}, got {self.window_cmvn!r}")

    def frames(self, stride: int, max_frames: int) -> tuple[int, int]:
        """``(window, context)`` in filterbank frames, multiples of the sub-sampling ``stride``; ``ValueError`` if
        the window is longer than the model takes (``max_frames``, its max_source_positions) or keeps no centre."""
        window = round(self.window_seconds * FRAMES_PER_SECOND / stride) * stride
        context = round(self.window_context_seconds * FRAMES_PER_SECOND / stride) * stride
        if window > max_frames:
            raise ValueError(f"window_seconds {self.window_seconds} is longer than this model takes: "
                             f"{max_frames / FRAMES_PER_SECOND:.2f} s ({max_frames} frames, its "
                             f"max_source_positions); use a window of at most that")
        if window - 2 * context < stride:
            raise ValueError(f"window_seconds {self.window_seconds} and window_context_seconds "
                             f"{self.window_context_seconds} leave no encoder frame between the contexts ({stride} "
                             "filterbank frames each)")
        return window, context


class Window(NamedTuple):
    """A window of filterbank frames ``[start, end)`` whose encoder frames for ``[centre_start, centre_end)`` are
    kept."""

    start: int
    centre_start: int
    centre_end: int
    end: int


def plan_windows(frames: int, window: int, context: int, stride: int) -> list[Window]:
    """The windows of a file of ``frames`` filterbank frames: one, the whole file, if it fits ``window``; else
    windows of ``window`` frames whose centres tile ``[0, frames)``, each centre ``context`` frames from its
    window's ends except at the file's ends (the last window starts early enough to be whole). ``window`` and
    ``context`` are multiples of ``stride``, and so are all boundaries but the file's end."""
    if frames <= window:
        return [Window(0, 0, frames, frames)]
    windows, centre_start = [], 0
    while True:
        start = max(0, centre_start - context)
        if frames - start <= window:  # this window reaches the end: it takes all the left context it can
            start = max(0, -(-(frames - window) // stride) * stride)
            windows.append(Window(start, centre_start, frames, frames))
            return windows
        centre_end = start + window - context
        windows.append(Window(start, centre_start, centre_end, start + window))
        centre_start = centre_end
