"""Streaming recognition with a causal transducer: audio in, chunk by chunk; a partial transcript out after each.

    from ssm_fairseq.streaming.transcriber import StreamingTranscriber
    stream = StreamingTranscriber("checkpoint_avg3.pt", beam=4)
    for samples in microphone_chunks():        # 16 kHz mono float32 in [-1, 1], any chunk size
        print(stream.accept_waveform(samples))  # the best hypothesis so far, in words
    text, words = stream.finish()              # the final transcript (and, with timestamps=True, its words
                                               # as TimedWord(word, start, end)); the next sample starts anew
    text, words = stream.stream_file("a.flac", 320)  # a whole file as a stream of 320 ms chunks

One object, one stream at a time. A stream starts with the first ``accept_waveform`` after construction,
``finish`` or ``reset``, and every chunk up to ``finish`` continues it: the object cannot tell two sources' chunks
apart unless told, so give each chunk its ``source`` (a file name, a connection id) and a chunk of another source
is refused (``StreamInProgressError``); ``stream_file`` is refused while a stream is in progress, and owns its
stream from start to end. The object serves one call at a time: a call made while another is running (from
another thread, or from ``stream_file``'s ``on_partial`` callback) is refused (``ConcurrentCallError``) rather than
waited for. For concurrent streams, make one ``StreamingTranscriber`` each.

Each chunk goes through the filterbank (``StreamingFilterbank``), the config's feature transforms, the encoder's
``step`` (every SSM carries its state from chunk to chunk: the work per chunk does not grow with the stream) and a
search that keeps its hypotheses between chunks (``TransducerGenerator.search``). So the final transcript is the one
``Transcriber`` gives offline for the same audio, whatever the chunk sizes: token for token in float32 (tested;
the recurrence and the offline FFT convolution differ by float32 rounding, about 1e-6, so a near tie between two
units could in principle go either way). In bfloat16 or float16 (``precision``) they are not equal: each path rounds
its activations to the half type (8 or 11 significant bits), differently (chunks against the whole utterance, the
recurrence against the FFT), so the streamed and offline encoder outputs differ by about the half type's rounding,
about as much as either differs from float32 (tested), and near ties go different ways as they go differently
between bfloat16 and float32 offline. Only how early partial results appear depends on the chunks. The partial
transcript ranks the hypotheses as the final one does (length-normalised, ``--lenpen``), so after the stream's last
encoder frame the partial transcript is the final one. The model must have a causal encoder (``--causal-encoder``,
e.g. ``--arch mssm_transducer_streaming``) and its data directory per-frame feature transforms (global CMVN,
prepared with ``--cmvn global``): utterance CMVN needs the whole utterance.
"""
from __future__ import annotations

import functools
import logging
import math
import numbers
import threading
from pathlib import Path
from typing import Callable, Hashable

import numpy as np
import torch

from ..audio_features import AudioError, SAMPLE_RATE, read_16k_mono
from ..transcribe import TimedTranscript, Transcriber
from .filterbank import StreamingFilterbank

logger = logging.getLogger("ssm_fairseq.streaming")

PartialCallback = Callable[[float, str], None]


class StreamInProgressError(RuntimeError):
    """A second stream started on a ``StreamingTranscriber`` before its stream in progress was finished."""


class ConcurrentCallError(RuntimeError):
    """A ``StreamingTranscriber`` called while another of its calls is running (another thread, or a callback)."""


class SampleRangeError(ValueError):
    """Float samples outside [-1, 1] (e.g. 16-bit PCM values as floats, not divided by 32768)."""


def _one_call_at_a_time(method):
    """``method`` of a ``StreamingTranscriber`` run holding its call lock, never waiting for it:
    ``ConcurrentCallError`` naming the running call if another holds it."""
    @functools.wraps(method)
    def exclusive(self: StreamingTranscriber, *args, **kwargs):
        if not self._lock.acquire(blocking=False):
            raise ConcurrentCallError(self._busy(method.__name__))
        self._running = (method.__name__, threading.current_thread())
        try:
            return method(self, *args, **kwargs)
        finally:
            self._running = None
            self._lock.release()
    return exclusive


def chunk_samples(chunk_ms: float) -> int:
    """Samples in a chunk of ``chunk_ms`` milliseconds at 16 kHz (rounded, at least one); ``ValueError`` unless
    ``chunk_ms`` is a positive finite number."""
    if isinstance(chunk_ms, bool) or not isinstance(chunk_ms, numbers.Real):
        raise ValueError(f"chunk_ms must be a number of milliseconds, got {chunk_ms!r}")
    if not (math.isfinite(chunk_ms) and chunk_ms > 0):
        raise ValueError(f"chunk_ms must be a positive, finite number of milliseconds, got {chunk_ms}")
    return max(1, round(chunk_ms * SAMPLE_RATE / 1000))


def check_sample_range(samples: np.ndarray | torch.Tensor, stream_sample: int) -> None:
    """``SampleRangeError`` naming the peak if 1-D, finite float ``samples`` go beyond [-1, 1] (``stream_sample``:
    the stream's count of samples before them). Anything else (integers, other shapes, NaN) is left to the
    filterbank, which names it."""
    if isinstance(samples, torch.Tensor):
        samples = samples.detach().cpu()
        samples = samples.float().numpy() if samples.is_floating_point() else samples.numpy()
    array = np.asarray(samples)
    if array.ndim != 1 or not array.size or not np.issubdtype(array.dtype, np.floating):
        return
    magnitudes = np.abs(array)
    if not np.isfinite(magnitudes).all() or magnitudes.max() <= 1.0:
        return
    peak = int(magnitudes.argmax())
    raise SampleRangeError(f"accept_waveform takes float samples in [-1, 1]; this chunk reaches {array[peak]:g} "
                           f"(at stream sample {stream_sample + peak}): samples at 16-bit scale? divide them by "
                           "32768")


class StreamingTranscriber:
    """A causal transducer checkpoint loaded once, transcribing one stream at a time.

    Arguments as ``Transcriber``'s (``checkpoint``, ``data_dir``, ``device``, ``beam``, ``search``,
    ``max_symbols_per_frame``, ``lenpen``, ``blank_penalty``, ``precision``, ``lm_path``, ``lm_weight``,
    ``lm_eos``); ``timestamps``: time the final transcript's words (needs a config without a pre-tokenizer; off:
    ``finish`` gives no words). Raises ``ValueError`` for a model whose encoder cannot run chunk by chunk, a data
    directory whose feature transforms need the whole utterance, or timestamps with a pre-tokenizer.
    """

    def __init__(self, checkpoint: Path | str, timestamps: bool = False, **options):
        self.offline = Transcriber(checkpoint, **options)
        problem = self.offline.streaming_problem()
        if problem:
            raise ValueError(problem)
        if timestamps:
            self.offline.check_timestamps()
        self.timestamps = timestamps
        self.dtype = self.offline.generator.model_dtype()
        self._lock = threading.Lock()
        self._running: tuple[str, threading.Thread] | None = None  # the call holding the lock, and its thread
        self._new_stream()

    def _new_stream(self) -> None:
        """No stream in progress: the next sample accepted starts one."""
        self.filterbank = StreamingFilterbank()
        self.encoder_cache: dict = {}
        self.search = self.offline.generator.search(1, self.offline.device)
        self.in_progress = False  # a chunk accepted since the stream started
        self.source: Hashable | None = None  # what the stream's chunks come from, as its first chunk said

    @_one_call_at_a_time
    def reset(self) -> None:
        """Discard the stream in progress, if any: the next sample starts a new utterance."""
        self._new_stream()

    @property
    def seconds_accepted(self) -> float:
        """Audio accepted so far in this stream, in seconds."""
        return self.filterbank.samples_accepted / StreamingFilterbank.sample_rate

    @torch.no_grad()
    def _advance(self, features: np.ndarray, final: bool) -> None:
        if self.offline.feature_transforms is not None and len(features):
            features = self.offline.feature_transforms(features)
        x = torch.from_numpy(np.ascontiguousarray(features)).to(self.offline.device, self.dtype).unsqueeze(0)
        encoded = self.offline.model.encoder.step(x, self.encoder_cache, final)
        if encoded.shape[1]:
            self.search.advance(encoded)

    def _accept(self, samples: np.ndarray | torch.Tensor) -> str:
        """Continue the stream with ``samples`` -> the partial transcript: the best hypothesis so far, ranked as
        ``finish`` ranks (``score / (labels + 1) ** lenpen``), in words."""
        self._advance(self.filterbank.accept_waveform(samples), final=False)
        self.in_progress = True
        return self.offline.text(self.search.partial(self.offline.generator.length_norm)[0].tokens)

    @_one_call_at_a_time
    def accept_waveform(self, samples: np.ndarray | torch.Tensor, source: Hashable | None = None) -> str:
        """The next samples of the stream (1-D, 16 kHz mono, float in [-1, 1]) -> the partial transcript: the best
        hypothesis over the encoder frames complete so far, in words. The first chunk after construction,
        ``finish`` or ``reset`` starts a stream.

        ``source``: what the samples come from (any hashable: a file name, a connection id); every chunk of a
        stream must give its first chunk's (None included), so that another source's chunk is refused rather than
        mixed into the transcript. Raises ``StreamInProgressError`` for a chunk of another source,
        ``SampleRangeError`` for samples beyond [-1, 1] (16-bit values: divide by 32768) and ``ValueError`` for
        samples that are not 1-D floats or not finite; a refused chunk leaves the stream as it was.
        """
        if self.in_progress and source != self.source:
            raise StreamInProgressError(
                f"accept_waveform(source={source!r}): the stream in progress is {self._describe_stream()}; a "
                f"StreamingTranscriber transcribes one stream at a time: finish() it first (or reset() to discard "
                f"it), or use one StreamingTranscriber per source")
        check_sample_range(samples, self.filterbank.samples_accepted)
        partial = self._accept(samples)
        self.source = source
        return partial

    @_one_call_at_a_time
    def finish(self) -> TimedTranscript:
        """End the stream: ``TimedTranscript(text, words)``, the final transcript and its words with their start
        and end times in seconds from the stream's start (``Transcriber.timed_words``). The next sample accepted
        starts a new utterance."""
        try:
            return self._final()
        finally:
            self._new_stream()

    def _final(self, path: Path | str | None = None) -> TimedTranscript:
        """The stream's final transcript; a non-finite score raises ``ValueError`` (``AudioError`` naming
        ``path`` if given)."""
        duration = self.seconds_accepted
        self._advance(np.zeros((0, StreamingFilterbank.num_mel_bins), dtype=np.float32), final=True)
        (best, *_), = self.search.finish(1, self.offline.generator.length_norm)
        if not math.isfinite(best.score):
            problem = f"the hypothesis score is not finite (NaN or inf): the {self.dtype} model computed NaN or inf"
            raise ValueError(problem) if path is None else AudioError(path, problem)
        words = self.offline.timed_words(best.tokens, best.frames, duration) if self.timestamps else []
        return TimedTranscript(self.offline.text(best.tokens), words)

    @_one_call_at_a_time
    def stream_file(self, path: Path | str, chunk_ms: float, on_partial: PartialCallback | None = None
                    ) -> TimedTranscript:
        """Transcribe an audio file (any format, rate and channels ``Transcriber`` reads; a conversion to 16 kHz
        mono is logged) as a stream of ``chunk_ms`` chunks (milliseconds, rounded to whole samples), as fast as
        they decode; ``on_partial(seconds, text)`` is called whenever the partial transcript changes, with the
        audio time it is at. The file's samples are taken as read, as ``Transcriber`` takes them.

        Raises ``ValueError`` for a ``chunk_ms`` that is not a positive finite number, ``StreamInProgressError``
        if a stream is in progress (from ``accept_waveform``), and ``AudioError`` naming a bad file (NaN or inf
        samples too). The stream ends with the call, whatever happens.
        """
        step = chunk_samples(chunk_ms)
        if self.in_progress:
            raise StreamInProgressError(
                f"stream_file({str(path)!r}): a stream is in progress ({self._describe_stream()}); finish() it "
                f"first (or reset() to discard it), or stream the file with another StreamingTranscriber")
        samples, conversion = read_16k_mono(path)
        if conversion:
            logger.info(f"{path}: not 16 kHz mono: {conversion} (to 16 kHz mono)")
        if not np.isfinite(samples).all():
            raise AudioError(path, "samples are not finite (NaN or inf in the audio)")
        self.source, shown = str(path), ""
        try:
            for start in range(0, len(samples), step):
                partial = self._accept(samples[start:start + step])
                if partial != shown and on_partial is not None:
                    on_partial(self.seconds_accepted, partial)
                shown = partial
            return self._final(path)
        finally:
            self._new_stream()

    def _describe_stream(self) -> str:
        """The stream in progress, for errors: its source and how much audio it has."""
        source = "no source given" if self.source is None else f"source {self.source!r}"
        return f"{self.seconds_accepted:.2f} s accepted, {source}, not finished"

    def _busy(self, call: str) -> str:
        """The message of a ``ConcurrentCallError`` for ``call``, naming the call running."""
        running = self._running
        if running is None:  # released in the meantime: still, two calls overlapped
            return f"StreamingTranscriber.{call} called while another call was running"
        name, thread = running
        where = ("from inside it (an on_partial callback?)" if thread is threading.current_thread()
                 else f"in thread {thread.name!r}, from thread {threading.current_thread().name!r}")
        return (f"StreamingTranscriber.{call} called while {name} is running {where}: a StreamingTranscriber "
                f"serves one call and one stream at a time; make one StreamingTranscriber per concurrent stream")
