"""Files of any length, offline, in bounded memory: the encoder run on overlapping windows, the centre of each kept,
and the search carried from window to window.

    windowing = Windowing(window_seconds=30, window_context_seconds=4)
    text = transcribe_long(recognizer, "meeting.flac", windowing)   # the file is never held whole

A file of up to ``window_seconds`` is one window: its features, encoder output and transcript are those of offline
transcription (``Recognizer.transcribe``), bit for bit. A longer file is cut into windows of ``window_seconds``
(the last one too, reaching back as far as it needs): each window's features are computed from its own span of the
file (``AudioSpans``), the bidirectional encoder runs on the window alone, and only its centre frames are kept: the
frames with ``window_context_seconds`` of the window on each side (at the file's start and end, the file's own edge).
The centres tile the file, so the frames kept are one encoder output of the whole file, which the search
(``TransducerGenerator.search``) takes window by window, keeping its hypotheses in between, exactly as it takes a
stream's chunks. What is held at once: one window's audio, features and encoder output, and the search's hypotheses.

A centre frame differs from what whole-file encoding would give it by what the encoder sees beyond the window
(``scripts/benchmarks/long_file_offline.py`` measures how much, and what it costs in WER). Utterance CMVN, a
whole-utterance statistic, is taken per window (``window_cmvn="window"``: each window normalised by its own mean and
variance, as the model saw utterances in training) or over the whole file (``window_cmvn="file"``: a first pass over
the file sums each bin and its square, so the features equal those of the whole file). A model that streams (a
causal encoder on per-frame features) needs no windows: the file's spans go through the encoder's ``step``, which
gives the whole-file encoding up to float32 rounding, as streaming does.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import torch
from fairseq.data.audio.feature_transforms.utterance_cmvn import UtteranceCMVN

from .encoder.subsampling import subsampling_stride
from .features.audio_features import NUM_MEL_BINS, AudioError, Conversions
from .features.audio_spans import AudioSpans
from .features.transforms import NonFiniteFeaturesError, transformed
from .search.transducer_generator import NonFiniteScoreError
from .transcripts import InputError, TimedTranscript
from .windowing import FRAMES_PER_SECOND, Window, Windowing, plan_windows

if TYPE_CHECKING:
    from .recognizer import Recognizer

logger = logging.getLogger("ssm_fairseq.transcribe")


def _file_cmvn(transforms, spans: AudioSpans, chunk: int) -> Callable[[np.ndarray], np.ndarray]:
    """The config's utterance CMVN with the whole file's mean and variance (a first pass over ``spans``,
    ``chunk`` frames at a time), as ``UtteranceCMVN`` computes them on the whole file; transforms that treat each
    frame alone are applied as they are. ``ValueError`` for any other transform."""
    steps = [] if transforms is None else transforms.transforms
    utterance = [step for step in steps if isinstance(step, UtteranceCMVN)]
    if not utterance:
        return lambda features: transformed(transforms, features)
    if len(steps) != 1:
        raise ValueError(f"window_cmvn='file' takes utterance CMVN alone, this config applies {steps}: use "
                         "window_cmvn='window'")
    (cmvn,) = utterance
    total, squares = np.zeros(NUM_MEL_BINS), np.zeros(NUM_MEL_BINS)
    for start in range(0, spans.frames, chunk):
        fbank = spans.filterbank(start, start + chunk).astype(np.float64)
        total += fbank.sum(axis=0)
        squares += (fbank ** 2).sum(axis=0)
    mean = total / spans.frames
    std = np.sqrt(np.maximum(squares / spans.frames - mean ** 2, 1e-10))
    shift, scale = (mean if cmvn.norm_means else 0.0), (std if cmvn.norm_vars else 1.0)
    return lambda features: transformed(None, ((features - shift) / scale).astype(np.float32))


def window_frames(recognizer: Recognizer, windowing: Windowing) -> tuple[int, int, int]:
    """``(window, context, stride)`` in filterbank frames for ``recognizer``'s model: ``Windowing.frames`` at its
    sub-sampling stride and max_source_positions."""
    cfg = recognizer.model.cfg
    stride = subsampling_stride(cfg.subsampler, cfg.tr_stride)
    return (*windowing.frames(stride, recognizer.max_frames), stride)


class WindowedEncoder:
    """A ``Recognizer``'s encoder over one file, window by window (see the module's docstring).

    ``windows`` are the file's windows (``plan_windows``); iterating yields each window's centre encoder frames,
    ``1 x n x D``, in order: together, an encoder output of the whole file.
    """

    def __init__(self, recognizer: Recognizer, spans: AudioSpans, windowing: Windowing):
        self.recognizer, self.spans = recognizer, spans
        window, context, self.stride = window_frames(recognizer, windowing)
        self.streams = recognizer.streaming_problem() is None
        if self.streams:  # the encoder's step carries everything: windows without context
            self.windows = [Window(start, start, min(start + window, spans.frames), min(start + window, spans.frames))
                            for start in range(0, spans.frames, window)]
        else:
            self.windows = plan_windows(spans.frames, window, context, self.stride)
        self.normalise = (_file_cmvn(recognizer.feature_transforms, spans, window)
                          if windowing.window_cmvn == "file" and len(self.windows) > 1 else
                          lambda features: transformed(recognizer.feature_transforms, features))

    @torch.no_grad()
    def __iter__(self) -> Iterator[torch.Tensor]:
        recognizer, path = self.recognizer, self.spans.path
        if len(self.windows) == 1 and not self.streams:  # the whole file, as offline transcription encodes it
            yield self._encode(recognizer.features(path))
            return
        cache: dict = {}
        features_state = recognizer.feature_stream() if self.streams else None  # adaptive CMVN's running statistics
        for n, window in enumerate(self.windows, 1):
            fbank = self.spans.filterbank(window.start, window.end)
            try:
                if self.streams:
                    yield recognizer.encode_chunk(fbank, cache, final=n == len(self.windows),
                                                  stream_features=features_state)
                    continue
                features = torch.from_numpy(self.normalise(fbank))
            except NonFiniteFeaturesError as error:
                raise AudioError(path, f"{error} (seconds {window.start / FRAMES_PER_SECOND:.2f} to "
                                       f"{window.end / FRAMES_PER_SECOND:.2f})") from error
            encoded = self._encode(features)
            first = (window.centre_start - window.start) // self.stride
            last = (encoded.shape[1] if window.centre_end == self.spans.frames else
                    (window.centre_end - window.start) // self.stride)
            if last > encoded.shape[1]:
                raise ValueError(f"the encoder gave {encoded.shape[1]} frames for {window.end - window.start} "
                                 f"filterbank frames, fewer than the window's centre needs ({last}): give the "
                                 f"windows more context")
            yield encoded[:, first:last]

    def _encode(self, features: torch.Tensor) -> torch.Tensor:
        """``T x 80`` features -> the ``1 x T' x D`` encoder output of them alone, as ``TransducerGenerator`` runs
        the encoder on a batch of one."""
        recognizer = self.recognizer
        encoder = recognizer.model.encoder(features.unsqueeze(0).to(recognizer.device, recognizer.dtype),
                                           torch.tensor([features.shape[0]], device=recognizer.device))
        return encoder["encoder_out"][:, :encoder["encoder_lengths"][0]]


@torch.no_grad()
def transcribe_long(recognizer: Recognizer, path: Path | str, windowing: Windowing, timestamps: bool = False,
                    conversions: Conversions | None = None) -> str | TimedTranscript:
    """The transcript of one file of any length (``TimedTranscript`` with ``timestamps``: words timed from the
    file's start), its encoder output taken window by window (``WindowedEncoder``) into one search. Raises
    ``AudioError`` or ``InputError`` naming the file."""
    spans = AudioSpans(path)
    if conversions is not None:
        conversions.add(path, spans.conversion)
    generator = recognizer.generator
    search = generator.search(1, recognizer.device)
    encoder = WindowedEncoder(recognizer, spans, windowing)
    every = max(1, len(encoder.windows) // 10)
    for n, (window, encoded) in enumerate(zip(encoder.windows, encoder), 1):
        if encoded.shape[1]:
            search.advance(encoded)
        if len(encoder.windows) > 1 and (n % every == 0 or n == len(encoder.windows)):
            logger.info(f"{path}: {window.centre_end / FRAMES_PER_SECOND:.0f} of {spans.duration:.0f} s "
                        f"transcribed ({n}/{len(encoder.windows)} windows)")
    results = search.finish(1, generator.length_norm)
    try:
        generator._check_finite(results, {"id": torch.tensor([0])})
    except NonFiniteScoreError as error:
        raise InputError([f"{path}: {error.reason}"]) from error
    best = results[0][0]
    text = recognizer.text(best.tokens)
    if not timestamps:
        return text
    return TimedTranscript(text, recognizer.timed_words(best.tokens, best.frames, spans.duration))
