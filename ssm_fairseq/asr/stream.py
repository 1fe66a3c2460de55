"""One live stream on a ``Recognizer``'s causal model: audio in, chunk by chunk; a partial transcript out after each.

    stream = recognizer.stream()                # as many as there are sources: they share the loaded model
    for samples in microphone_chunks():         # 16 kHz mono float32 in [-1, 1], any chunk size
        print(stream.accept_waveform(samples))  # the best hypothesis so far, in words
    text, words = stream.finish()               # the final transcript (words timed with stream(timestamps=True));
                                                # the next sample starts a new utterance on the same stream
    text, words = stream.stream_file("a.flac", 320)  # a whole file as a stream of 320 ms chunks

A ``Stream`` holds one stream's state (the streaming filterbank, the encoder's step cache, the search's hypotheses,
the samples accepted and the source named by its first chunk); the ``Recognizer`` holds what every stream only
reads. An utterance starts with the first ``accept_waveform`` after creation, ``finish`` or ``reset``, and every
chunk up to ``finish`` continues it: give each chunk its ``source`` (a file name, a connection id) and a chunk of
another source is refused (``StreamInProgressError``); ``stream_file`` is refused while an utterance is in progress,
and owns its utterance from start to end. A stream serves one call at a time: a call made while another is running
(from another thread, or from ``stream_file``'s ``on_partial`` callback) is refused (``ConcurrentCallError``) rather
than waited for. Streams of one recognizer may run in different threads.

Each chunk goes through the filterbank (``StreamingFilterbank``), the config's feature transforms (checked finite,
as offline), the encoder's ``step`` (every SSM carries its state from chunk to chunk: the work per chunk does not
grow with the stream) and a search that keeps its hypotheses between chunks (``TransducerGenerator.search``). So the
final transcript is the one ``Recognizer.transcribe`` gives offline for the same audio, whatever the chunk sizes:
token for token in float32 (the recurrence and the offline FFT convolution differ by float32 rounding, about 1e-6);
in bfloat16 or float16 each path rounds differently, about as much as either differs from float32. The partial
transcript ranks the hypotheses as the final one does (length-normalised, ``--lenpen``), so after the stream's last
encoder frame the partial transcript is the final one.
"""
from __future__ import annotations

import functools
import logging
import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Hashable

import numpy as np
import torch

from .features.audio_features import SAMPLE_RATE, AudioError, read_16k_mono
from .features.filterbank import StreamingFilterbank
from .features.transforms import NonFiniteFeaturesError
from .samples import check_sample_range, chunk_samples
from .transcripts import TimedTranscript

if TYPE_CHECKING:
    from .recognizer import Recognizer

logger = logging.getLogger("ssm_fairseq.asr")  # the name streaming's log lines have always had

PartialCallback = Callable[[float, str], None]


class StreamInProgressError(RuntimeError):
    """A chunk of another source, or a file, given to a stream before its utterance in progress was finished."""


class ConcurrentCallError(RuntimeError):
    """A ``Stream`` called while another of its calls is running (another thread, or a callback)."""


def _one_call_at_a_time(method):
    """``method`` of a ``Stream`` run holding its call lock, never waiting for it: ``ConcurrentCallError`` naming
    the running call if another holds it."""
    @functools.wraps(method)
    def exclusive(self: Stream, *args, **kwargs):
        if not self._lock.acquire(blocking=False):
            raise ConcurrentCallError(self._busy(method.__name__))
        self._running = (method.__name__, threading.current_thread())
        try:
            return method(self, *args, **kwargs)
        finally:
            self._running = None
            self._lock.release()
    return exclusive


class Stream:
    """One stream's state on a shared ``Recognizer`` (made by ``Recognizer.stream``, which checks that the model
    can stream). ``timestamps``: time the final transcripts' words (off: ``finish`` gives no words)."""

    def __init__(self, recognizer: Recognizer, timestamps: bool = False):
        self.recognizer = recognizer
        self.timestamps = timestamps
        self._lock = threading.Lock()
        self._running: tuple[str, threading.Thread] | None = None  # the call holding the lock, and its thread
        self._new_utterance()

    def _new_utterance(self) -> None:
        """No utterance in progress: the next sample accepted starts one."""
        self.filterbank = StreamingFilterbank()
        self.encoder_cache: dict = {}
        self.search = self.recognizer.generator.search(1, self.recognizer.device)
        self.in_progress = False  # a chunk accepted since the utterance started
        self.source: Hashable | None = None  # what the utterance's chunks come from, as its first chunk said

    @property
    def seconds_accepted(self) -> float:
        """Audio accepted so far in this utterance, in seconds."""
        return self.filterbank.samples_accepted / SAMPLE_RATE

    @_one_call_at_a_time
    def reset(self) -> None:
        """Discard the utterance in progress, if any: the next sample starts a new one."""
        self._new_utterance()

    @torch.no_grad()
    def _advance(self, features: np.ndarray, final: bool) -> None:
        """``T x 80`` filterbank frames (``T`` may be 0) -> the encoder frames they complete, into the search."""
        encoded = self.recognizer.encode_chunk(features, self.encoder_cache, final)
        if encoded.shape[1]:
            self.search.advance(encoded)

    def _accept(self, samples: np.ndarray | torch.Tensor) -> str:
        """Continue the utterance with ``samples`` -> the partial transcript: the best hypothesis so far, ranked as
        ``finish`` ranks (``score / (labels + 1) ** lenpen``), in words."""
        self._advance(self.filterbank.accept_waveform(samples), final=False)
        self.in_progress = True
        return self.recognizer.text(self.search.partial(self.recognizer.generator.length_norm)[0].tokens)

    @_one_call_at_a_time
    def accept_waveform(self, samples: np.ndarray | torch.Tensor, source: Hashable | None = None) -> str:
        """The next samples (1-D, 16 kHz mono, float in [-1, 1]) -> the partial transcript: the best hypothesis over
        the encoder frames complete so far, in words. The first chunk after creation, ``finish`` or ``reset``
        starts an utterance.

        ``source``: what the samples come from (any hashable: a file name, a connection id); every chunk of an
        utterance must give its first chunk's (None included), so that another source's chunk is refused rather
        than mixed into the transcript. Raises ``StreamInProgressError`` for a chunk of another source,
        ``SampleRangeError`` for samples beyond [-1, 1] (16-bit values: divide by 32768) and ``ValueError`` for
        samples that are not 1-D floats or not finite (a refused chunk leaves the stream as it was), or for
        features that are not finite after the transforms (``NonFiniteFeaturesError``: ``reset`` the stream).
        """
        if self.in_progress and source != self.source:
            raise StreamInProgressError(
                f"accept_waveform(source={source!r}): the stream in progress is {self._describe()}; a stream "
                f"transcribes one source at a time: finish() it first (or reset() to discard it), or open one stream "
                f"per source (Recognizer.stream(): streams share the loaded model)")
        check_sample_range(samples, self.filterbank.samples_accepted)
        partial = self._accept(samples)
        self.source = source
        return partial

    @_one_call_at_a_time
    def finish(self) -> TimedTranscript:
        """End the utterance: ``TimedTranscript(text, words)``, the final transcript and its words with their start
        and end times in seconds from the utterance's start (``Recognizer.timed_words``). The next sample accepted
        starts a new utterance."""
        try:
            return self._final()
        finally:
            self._new_utterance()

    def _final(self, path: Path | str | None = None) -> TimedTranscript:
        """The utterance's final transcript; a non-finite score raises ``ValueError`` (``AudioError`` naming
        ``path`` if given)."""
        duration = self.seconds_accepted
        self._advance(np.zeros((0, StreamingFilterbank.num_mel_bins), dtype=np.float32), final=True)
        (best, *_), = self.search.finish(1, self.recognizer.generator.length_norm)
        if not math.isfinite(best.score):
            problem = (f"the hypothesis score is not finite (NaN or inf): the {self.recognizer.dtype} model computed "
                       "NaN or inf")
            raise ValueError(problem) if path is None else AudioError(path, problem)
        words = self.recognizer.timed_words(best.tokens, best.frames, duration) if self.timestamps else []
        return TimedTranscript(self.recognizer.text(best.tokens), words)

    @_one_call_at_a_time
    def stream_file(self, path: Path | str, chunk_ms: float, on_partial: PartialCallback | None = None
                    ) -> TimedTranscript:
        """Transcribe an audio file (any format, rate and channels ``Recognizer.transcribe`` reads; a conversion to
        16 kHz mono is logged) as a stream of ``chunk_ms`` chunks (milliseconds, rounded to whole samples), as fast
        as they decode; ``on_partial(seconds, text)`` is called whenever the partial transcript changes, with the
        audio time it is at. The file's samples are taken as read, as offline transcription takes them.

        Raises ``ValueError`` for a ``chunk_ms`` that is not a positive finite number, ``StreamInProgressError``
        if an utterance is in progress (from ``accept_waveform``), and ``AudioError`` naming a bad file (NaN or
        inf samples or features too). The utterance ends with the call, whatever happens.
        """
        step = chunk_samples(chunk_ms)
        if self.in_progress:
            raise StreamInProgressError(
                f"stream_file({str(path)!r}): a stream is in progress ({self._describe()}); finish() it first (or "
                f"reset() to discard it), or stream the file on another stream (Recognizer.stream())")
        samples, conversion = read_16k_mono(path)
        if conversion:
            logger.info(f"{path}: not 16 kHz mono: {conversion} (to 16 kHz mono)")
        if not np.isfinite(samples).all():
            raise AudioError(path, "samples are not finite (NaN or inf in the audio)")
        self.source = str(path)
        try:
            self._stream_samples(samples, step, on_partial)
            return self._final(path)
        except NonFiniteFeaturesError as error:
            raise AudioError(path, str(error)) from error
        finally:
            self._new_utterance()

    def _stream_samples(self, samples: np.ndarray, step: int, on_partial: PartialCallback | None) -> None:
        """Accept ``samples`` ``step`` at a time, calling ``on_partial(seconds, text)`` whenever the text changes."""
        shown = ""
        for start in range(0, len(samples), step):
            partial = self._accept(samples[start:start + step])
            if partial != shown and on_partial is not None:
                on_partial(self.seconds_accepted, partial)
            shown = partial

    def _describe(self) -> str:
        """The utterance in progress, for errors: its source and how much audio it has."""
        source = "no source given" if self.source is None else f"source {self.source!r}"
        return f"{self.seconds_accepted:.2f} s accepted, {source}, not finished"

    def _busy(self, call: str) -> str:
        """The message of a ``ConcurrentCallError`` for ``call``, naming the call running."""
        running = self._running
        if running is None:  # released in the meantime: still, two calls overlapped
            return f"Stream.{call} called while another call was running"
        name, thread = running
        where = ("from inside it (an on_partial callback?)" if thread is threading.current_thread()
                 else f"in thread {thread.name!r}, from thread {threading.current_thread().name!r}")
        return (f"{call} called while {name} is running {where}: a stream serves one call at a time; open one "
                f"stream per concurrent source (Recognizer.stream(): streams share the loaded model)")
