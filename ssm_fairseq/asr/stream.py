"""One live stream on a ``Recognizer``'s causal model: audio in, chunk by chunk; a partial transcript out after each.

    stream = recognizer.stream()                # as many as there are sources: they share the loaded model
    for samples in microphone_chunks():         # 16 kHz mono float32 in [-1, 1], any chunk size
        print(stream.accept_waveform(samples))  # the best hypothesis so far, in words
    text, words = stream.finish()               # the final transcript (words timed with stream(timestamps=True));
                                                # the next sample starts a new utterance on the same stream
    text, words = stream.stream_file("a.flac", 320)  # a whole file as a stream of 320 ms chunks

    stream = recognizer.stream(endpoints=EndpointRules())  # cut into segments at pauses (ssm_fairseq.asr.endpoints)
    stream.accept_waveform(samples)             # the partial transcript of the segment in progress
    stream.segments                             # the segments ended so far: Segment(start, end, text, words)
    segments = stream.finish_segments()         # all of them, the last one ended (stream_file_segments: a file's)

A ``Stream`` holds one stream's state (the streaming filterbank, the transformed frames waiting for a whole
sub-sampling group, the encoder's step cache, the search's hypotheses, the segments ended, the samples accepted
and the source named by its first chunk); the ``Recognizer`` holds what every stream only reads. An utterance
starts with the first ``accept_waveform`` after creation, ``finish`` or ``reset``, and every chunk up to ``finish``
continues it: give each chunk its ``source`` (a file name, a connection id) and a chunk of another source is
refused (``StreamInProgressError``); ``stream_file`` is refused while an utterance is in progress, and owns its
utterance from start to end. A stream serves one call at a time: a call made while another is running (from
another thread, or from ``stream_file``'s ``on_partial`` callback) is refused (``ConcurrentCallError``) rather
than waited for. Streams of one recognizer may run in different threads, or be stepped together as one batch
(``Recognizer.step_streams``, ``ssm_fairseq.asr.stream_batch``).

Each chunk goes through the filterbank (``StreamingFilterbank``) and the config's feature transforms (checked
finite, as offline); the frames wait until they fill whole sub-sampling groups (4 frames for the ``tr`` and ``ms``
sub-samplers), which go through the encoder's ``step`` (every SSM carries its state from chunk to chunk: the work
per chunk does not grow with the stream) and a search that keeps its hypotheses between chunks
(``TransducerGenerator.search``); ``finish`` sends the last, partial group. So the final transcript is the one
``Recognizer.transcribe`` gives offline for the same audio, whatever the chunk sizes: token for token in float32
(the recurrence and the offline FFT convolution differ by float32 rounding, about 1e-6); in bfloat16 or float16
each path rounds differently, about as much as either differs from float32. The partial transcript ranks the
hypotheses as the final one does (length-normalised, ``--lenpen``), so after the stream's last encoder frame the
partial transcript is the final one.

A model with look-ahead (``--lookahead-frames K``, ``encoder.lookahead``) gives each encoder frame to the search
``K`` frames late: the encoder holds a stream's last ``K`` sub-sampled frames until their successors arrive, and
``finish`` gives them (their future completed with zeros, as offline at an utterance's end). ``lookahead_seconds``
is that latency (``K`` x 40 ms at the sub-sampling stride 4); the transcripts are still offline's, with the same
``K``.

With ``endpoints`` (``EndpointRules``), the stream is cut into segments: after each chunk the rules look at the
segment's best hypothesis, and at an endpoint the segment ends (its final transcript, as ``finish`` gives it, with
its start and end in seconds from the utterance's start) and the search starts afresh (the language model's
context too: each search has its own), while the filterbank and the encoder carry on (the encoder starts afresh
too with ``EndpointRules(reset_encoder=True)``: with look-ahead, the new encoder starts at the segment's first
frame, re-taking the feature frames whose encoder frames the old one still held; the last frames of the segment
before looked ahead into them, as their audio was there). Segments without a word are
not kept, nor those after an endpoint whose labels all came at their first frame (a causal model's sentence-initial
prior, emitted before any speech: ``ssm_fairseq.asr.endpoints`` says more). Without endpoints the utterance is one
segment, from 0 to its length, kept even without a word.

What a stream holds does not grow with its length, but for the segments it has ended (each its own text and words,
joined only by ``finish``): the filterbank keeps less than a window of samples, the frames waiting for the encoder
less than a sub-sampling group, the encoder a state of fixed size; the search, its language model's context and
the partial transcript (``IncrementalText``, which detokenizes only the units after those the last chunk's best
hypothesis shares, ``ssm_fairseq.asr.incremental_text``) are the segment's and start afresh at each endpoint, so
with endpoints a chunk's work is bounded by the longest segment (``max_segment``, 20 s). Without endpoints the
utterance is one segment, and its search grows with it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Hashable, Iterator

import numpy as np
import torch

from .endpoints import EndpointRules
from .features.audio_features import NUM_MEL_BINS, SAMPLE_RATE, AudioError, read_16k_mono
from .features.filterbank import StreamingFilterbank
from .features.transforms import NonFiniteFeaturesError
from .pause_segments import FRAMES_PER_SECOND, CausalQuietness
from .samples import check_sample_range, chunk_samples
from .incremental_text import IncrementalText
from .search.hypothesis import Hypothesis
from .transcripts import Segment, TimedTranscript, joined

if TYPE_CHECKING:
    from .recognizer import Recognizer

# Filterbank frames of a pause's end fed to the encoder before the next segment's first frame that is not quiet
# (pause endpoints). Measured with the mini recipe's streaming model on test-mini joined three by three with 1 s
# pauses (0.5 s pause endpoints, 320 ms chunks): the WER of the 2nd and 3rd utterances of each recording was
# 27.6 and 28.4% with none, 52.0 and 43.3% with 10 frames (0.1 s), 50.4 and 47.8% with 25 (as offline: the model
# writes words into a quiet start, ``pause_segments``). Those figures predate the pieces' edge rules
# (``pause_segments``: a piece now starts where its sound does), which brought the whole recordings' WER to that of
# the utterances one by one with none; the longer pre-rolls were not measured again.
PAUSE_PRE_ROLL = 0

logger = logging.getLogger("ssm_fairseq.asr")  # the name streaming's log lines have always had

PartialCallback = Callable[[float, str], None]


class StreamInProgressError(RuntimeError):
    """A chunk of another source, or a file, given to a stream before its utterance in progress was finished."""


class ConcurrentCallError(RuntimeError):
    """A ``Stream`` called while another of its calls is running (another thread, or a callback)."""


def _one_call_at_a_time(method):
    """``method`` of a ``Stream`` run holding its call lock (``Stream.held``), never waiting for it."""
    @functools.wraps(method)
    def exclusive(self: Stream, *args, **kwargs):
        with self.held(method.__name__):
            return method(self, *args, **kwargs)
    return exclusive


class Stream:
    """One stream's state on a shared ``Recognizer`` (made by ``Recognizer.stream``, which checks that the model
    can stream). ``timestamps``: time the final transcripts' words (off: ``finish`` gives no words);
    ``endpoints``: cut the stream into segments by these rules (None: one segment)."""

    def __init__(self, recognizer: Recognizer, timestamps: bool = False, endpoints: EndpointRules | None = None):
        self.recognizer = recognizer
        self.timestamps = timestamps
        self.endpoints = endpoints
        self._lock = threading.Lock()
        self._running: tuple[str, threading.Thread] | None = None  # the call holding the lock, and its thread
        self._new_utterance()

    def _new_utterance(self) -> None:
        """No utterance in progress: the next sample accepted starts one."""
        self.filterbank = StreamingFilterbank()
        self.features = self.recognizer.feature_stream()  # the transforms' running statistics (adaptive CMVN)
        self.waiting = np.zeros((0, NUM_MEL_BINS), dtype=np.float32)  # transformed frames short of a whole group
        self.fed = np.zeros((0, NUM_MEL_BINS), dtype=np.float32)  # the encoder's last look-ahead's worth of input
        self.encoder_cache: dict = {}
        self.in_progress = False  # a chunk accepted since the utterance started
        self.source: Hashable | None = None  # what the utterance's chunks come from, as its first chunk said
        self.segments: list[Segment] = []  # the segments ended so far by endpoints
        # pause endpoints (``EndpointRules.pause_seconds``): the quiet test, the quiet run held back, where it is
        self.quietness = CausalQuietness()
        self.quiet_held = np.zeros((0, NUM_MEL_BINS), dtype=np.float32)  # transformed frames of a quiet run
        self.frames_seen = 0  # filterbank frames of the utterance so far
        self.in_pause = False  # a pause is being dropped: the next frame that is not quiet starts a segment
        self.time_offset = 0.0  # seconds: a segment's start less its start frame's time (the pauses dropped)
        self.after_pause = False  # the segment in progress started after a pause
        self._new_segment(0)

    @property
    def pause_frames(self) -> int | None:
        """Filterbank frames of quiet that end a segment (``EndpointRules.pause_seconds``), or None (off)."""
        if self.endpoints is None or self.endpoints.pause_seconds is None:
            return None
        return math.ceil(self.endpoints.pause_seconds * FRAMES_PER_SECOND)

    def _new_segment(self, start_frame: int) -> None:
        """A new search, for the segment starting at the utterance's encoder frame ``start_frame``."""
        self.search = self.recognizer.generator.search(1, self.recognizer.device)
        self.segment_start = start_frame
        self.best: Hypothesis | None = None  # the segment's best hypothesis so far (``search.partial``)
        self.text = IncrementalText(self.recognizer.unit_pieces)  # its partial transcript, kept unit by unit

    @contextlib.contextmanager
    def held(self, call: str) -> Iterator[None]:
        """Hold this stream's call lock for ``call`` (a name, for errors), never waiting for it:
        ``ConcurrentCallError`` naming the running call if another holds it."""
        if not self._lock.acquire(blocking=False):
            raise ConcurrentCallError(self._busy(call))
        self._running = (call, threading.current_thread())
        try:
            yield
        finally:
            self._running = None
            self._lock.release()

    @property
    def seconds_accepted(self) -> float:
        """Audio accepted so far in this utterance, in seconds."""
        return self.filterbank.samples_accepted / SAMPLE_RATE

    @_one_call_at_a_time
    def reset(self) -> None:
        """Discard the utterance in progress, if any: the next sample starts a new one."""
        self._new_utterance()

    def check_chunk(self, samples: np.ndarray | torch.Tensor, source: Hashable | None) -> None:
        """Errors for a chunk this stream would refuse (see ``accept_waveform``), before anything is changed."""
        if self.in_progress and source != self.source:
            raise StreamInProgressError(
                f"accept_waveform(source={source!r}): the stream in progress is {self._describe()}; a stream "
                f"transcribes one source at a time: finish() it first (or reset() to discard it), or open one stream "
                f"per source (Recognizer.stream(): streams share the loaded model)")
        check_sample_range(samples, self.filterbank.samples_accepted)
        self.filterbank._validated(samples)  # the filterbank's checks, before any stream changes

    def take_samples(self, samples: np.ndarray | torch.Tensor, source: Hashable | None) -> None:
        """Continue the utterance of ``source`` with ``samples``: their filterbank frames, transformed, wait for the
        encoder (``encoder_input``)."""
        frames = self.recognizer.transform_chunk(self.filterbank.accept_waveform(samples), self.features)
        self.waiting = np.concatenate([self.waiting, frames]) if len(self.waiting) else frames
        self.in_progress, self.source = True, source

    def encoder_input(self, final: bool) -> np.ndarray:
        """The waiting frames the encoder takes now, ``n x 80``, removed from the wait: as many whole sub-sampling
        groups as there are (all of them if ``final``, the stream ending), so that no frame waits in the encoder's
        sub-sampler and streams at the same point of their chunking have caches of the same shapes
        (``stack_caches``). With look-ahead, the last ``K`` groups' worth are also kept (``fed``), for an encoder
        reset at an endpoint (``_reset_encoder``)."""
        stride = self.recognizer.encoder_stride
        take = len(self.waiting) if final else len(self.waiting) // stride * stride
        frames, self.waiting = self.waiting[:take], self.waiting[take:]
        keep = self.lookahead_frames * stride  # what a look-ahead can hold of them
        if keep and len(frames):
            self.fed = np.concatenate([self.fed, frames])[-keep:]
        return frames

    @property
    def lookahead_frames(self) -> int:
        """``K``: the encoder frames of look-ahead of the model (``--lookahead-frames``, from its config as the
        sub-sampling stride is; 0 for a checkpoint without the option)."""
        return self.recognizer.model.cfg.lookahead_frames

    @property
    def lookahead_seconds(self) -> float:
        """The latency the encoder's look-ahead adds: an encoder frame reaches the search ``lookahead_frames``
        frames after its own audio (``K x frame_seconds``, 40 ms per frame at the sub-sampling stride 4), on top of
        the chunk's own duration and the sub-sampling group's wait."""
        return self.lookahead_frames * self.recognizer.frame_seconds

    def _reset_encoder(self) -> None:
        """Start the encoder afresh (``EndpointRules.reset_encoder``) at the first frame the search has not had: the
        feature frames whose encoder frames the look-ahead still holds go back to the front of the wait, so the new
        encoder takes them first (without look-ahead, none)."""
        if self.lookahead_frames:
            held = self.recognizer.model.encoder.frames_held(self.encoder_cache) * self.recognizer.encoder_stride
            self.waiting = np.concatenate([self.fed[len(self.fed) - held:], self.waiting])
        self.fed = self.fed[:0]
        self.encoder_cache = {}

    def search_frames(self, encoded: torch.Tensor) -> None:
        """The next ``1 x m x D`` encoder frames of the utterance (``m`` may be 0) into the search; then, with
        endpoints, end the segment if a rule says so."""
        if not encoded.shape[1]:
            return
        self.search.advance(encoded)
        self.best = None
        if self.endpoints is not None:
            best = self.partial_hypothesis()
            frames = self.search.frames_done[0]
            trailing = frames - (best.frames[-1] + 1) if best.tokens else frames
            seconds = self.recognizer.frame_seconds
            if self.endpoints.rule(frames * seconds, trailing * seconds, bool(best.tokens)) is not None:
                self._end_segment(final=False)

    def partial_hypothesis(self) -> Hypothesis:
        """The segment's best hypothesis so far, ranked as ``finish`` ranks (``score / (labels + 1) ** lenpen``)."""
        if self.best is None:
            self.best = self.search.partial(self.recognizer.generator.length_norm)[0]
        return self.best

    def partial_text(self) -> str:
        """The partial transcript of the segment in progress (the utterance, without endpoints), in words:
        ``Recognizer.text`` of the best hypothesis, detokenizing only its units after those it shares with the last
        chunk's (``IncrementalText``); with a pre-tokenizer, whose decoding is not per unit, the whole hypothesis."""
        tokens = self.partial_hypothesis().tokens
        if self.recognizer.tokenizer is not None:
            return self.recognizer.text(tokens)
        return self.text.text(tokens)

    @torch.no_grad()
    def _advance(self, final: bool) -> None:
        """The waiting frames the encoder takes now (``encoder_input``) -> the encoder frames they complete, into
        the search. Not ``final`` and no whole group waiting: nothing to do (the encoder's cache is made by its first
        frames)."""
        frames = self.encoder_input(final)
        if len(frames) or final:
            self.search_frames(self.recognizer.encode_features(frames, self.encoder_cache, final))

    def _accept(self, samples: np.ndarray | torch.Tensor, source: Hashable | None) -> str:
        """Continue the utterance with ``samples`` -> the partial transcript."""
        if self.pause_frames is None:
            self.take_samples(samples, source)
            self._advance(final=False)
        else:
            self._take_samples_cut_at_pauses(samples, source)
        return self.partial_text()

    def _take_samples_cut_at_pauses(self, samples: np.ndarray | torch.Tensor, source: Hashable | None) -> None:
        """``take_samples`` and ``_advance`` with pause endpoints (``ssm_fairseq.asr.endpoints``): the runs of quiet
        frames (``CausalQuietness``) are held back; one that reaches ``pause_frames`` ends the segment where it
        began and is dropped, and the next frame that is not quiet starts a segment on a fresh encoder. Each frame's
        fate depends only on the frames up to it: the segments do not depend on the chunking."""
        fbank = self.filterbank.accept_waveform(samples)
        frames = self.recognizer.transform_chunk(fbank, self.features)
        quiet = self.quietness.quiet(fbank, samples)  # the samples: where clips start (pause_segments)
        self.in_progress, self.source = True, source
        edges = np.flatnonzero(np.diff(quiet.astype(np.int8))) + 1
        for start, end in zip([0, *edges], [*edges, len(frames)]):
            at = self.frames_seen + start  # the run's first frame in the utterance
            if not quiet[start]:
                if self.in_pause:
                    self._resume_after_pause(at)
                self.waiting = np.concatenate([self.waiting, self.quiet_held, frames[start:end]])
                self.quiet_held = self.quiet_held[:0]
                self._advance(final=False)
            else:
                self.quiet_held = np.concatenate([self.quiet_held, frames[start:end]])
                if self.in_pause:  # only the last PAUSE_PRE_ROLL frames of a pause are kept, for the next segment
                    self.quiet_held = self.quiet_held[len(self.quiet_held) - PAUSE_PRE_ROLL:]
                elif len(self.quiet_held) >= self.pause_frames:
                    self._end_at_pause((at + end - start - len(self.quiet_held)) / FRAMES_PER_SECOND)
        self.frames_seen += len(frames)

    def _end_at_pause(self, pause_start: float) -> None:
        """A pause began at ``pause_start`` seconds: the encoder finishes the frames before it (as at an utterance's
        end), the segment ends there, the pause's frames are dropped, and the encoder starts afresh."""
        self.quiet_held = self.quiet_held[len(self.quiet_held) - PAUSE_PRE_ROLL:]
        self._advance(final=True)
        self._end_segment(final=False, end_seconds=pause_start, reset_encoder=False)
        self.fed = self.fed[:0]
        self.encoder_cache = {}
        self.in_pause = True

    def _resume_after_pause(self, frame: int) -> None:
        """The first frame after a pause (``frame``, of the utterance's filterbank frames): the segment in progress
        (a new search, no frame yet) starts at its time."""
        self.in_pause = False
        self.after_pause = True
        frame -= len(self.quiet_held)  # the pause's last PAUSE_PRE_ROLL frames start the segment
        self.time_offset = frame / FRAMES_PER_SECOND - self.segment_start * self.recognizer.frame_seconds

    @_one_call_at_a_time
    def accept_waveform(self, samples: np.ndarray | torch.Tensor, source: Hashable | None = None) -> str:
        """The next samples (1-D, 16 kHz mono, float in [-1, 1]) -> the partial transcript: the best hypothesis over
        the encoder frames complete so far, in words (of the segment in progress, with endpoints). The first chunk
        after creation, ``finish`` or ``reset`` starts an utterance.

        ``source``: what the samples come from (any hashable: a file name, a connection id); every chunk of an
        utterance must give its first chunk's (None included), so that another source's chunk is refused rather
        than mixed into the transcript. Raises ``StreamInProgressError`` for a chunk of another source,
        ``SampleRangeError`` for samples beyond [-1, 1] (16-bit values: divide by 32768) and ``ValueError`` for
        samples that are not 1-D floats or not finite (a refused chunk leaves the stream as it was), or for
        features that are not finite after the transforms (``NonFiniteFeaturesError``: ``reset`` the stream).
        """
        self.check_chunk(samples, source)
        return self._accept(samples, source)

    @_one_call_at_a_time
    def finish(self) -> TimedTranscript:
        """End the utterance: ``TimedTranscript(text, words)``, the final transcript and its words with their start
        and end times in seconds from the utterance's start (``Recognizer.timed_words``); with endpoints, its
        segments' joined. The next sample accepted starts a new utterance."""
        return joined(self._finish())

    @_one_call_at_a_time
    def finish_segments(self) -> list[Segment]:
        """End the utterance: its segments (``Segment(start, end, text, words)``, seconds from its start; words
        with timestamps), the last one ended here. Without endpoints, one. The next sample starts a new
        utterance."""
        return self._finish()

    def _finish(self, path: Path | str | None = None) -> list[Segment]:
        try:
            if not self.in_pause:  # a quiet run at the end, shorter than a pause: the last segment's
                self.waiting = np.concatenate([self.waiting, self.quiet_held])
            self._advance(final=True)
            self._end_segment(final=True, path=path)
            return self.segments
        finally:
            self._new_utterance()

    def _end_segment(self, final: bool, path: Path | str | None = None, end_seconds: float | None = None,
                     reset_encoder: bool = True) -> None:
        """End the segment in progress (with ``final``, the utterance's last): its final transcript into
        ``segments`` (unless endpoints are on and it has no word), then a new search from the next frame (and
        encoder, with ``EndpointRules.reset_encoder`` unless ``reset_encoder`` is False). ``end_seconds``: where it
        ends (default: after its last encoder frame). A non-finite score raises ``ValueError`` (``AudioError``
        naming ``path`` if given)."""
        (best, *_), = self.search.finish(1, self.recognizer.generator.length_norm)
        if not math.isfinite(best.score):
            problem = (f"the hypothesis score is not finite (NaN or inf): the {self.recognizer.dtype} model computed "
                       "NaN or inf")
            raise ValueError(problem) if path is None else AudioError(path, problem)
        seconds, duration = self.recognizer.frame_seconds, self.seconds_accepted
        frames = self.search.frames_done[0]
        offset = self.time_offset  # the pauses dropped before the segment, in seconds
        start = self.segment_start * seconds + offset
        end = duration if final else end_seconds if end_seconds is not None else (
            (self.segment_start + frames) * seconds + offset)
        # the segment's words inside it: a word's start and end reach over blank frames, not over the cut
        words = (self.recognizer.timed_words(best.tokens, [self.segment_start + f for f in best.frames],
                                             min(end, duration) - offset, not_before=min(start, end) - offset)
                 if self.timestamps else [])
        if offset:
            words = [word._replace(start=word.start + offset, end=word.end + offset) for word in words]
        text = self.recognizer.text(best.tokens)
        if self.endpoints is None or (text and (self.after_pause or not self._prior_only(best))):
            self.segments.append(Segment(min(start, end), end, text, words))
        if not final and reset_encoder and self.endpoints.reset_encoder:
            self._reset_encoder()  # the next frames start the encoder afresh, as a new utterance
        self.after_pause = False
        self._new_segment(self.segment_start + frames)

    def _prior_only(self, best: Hypothesis) -> bool:
        """Whether a segment after an endpoint holds only labels its search emitted at its first frame: a causal
        model's sentence-initial prior (it emits a sentence's usual first word before hearing anything), what a
        search restarted in a pause gives there, not speech."""
        return self.segment_start > 0 and all(frame == 0 for frame in best.frames)

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
        return joined(self._stream_file(path, chunk_ms, on_partial))

    @_one_call_at_a_time
    def stream_file_segments(self, path: Path | str, chunk_ms: float, on_partial: PartialCallback | None = None
                             ) -> list[Segment]:
        """``stream_file``, giving the file's segments (``finish_segments``) rather than their joined transcript."""
        return self._stream_file(path, chunk_ms, on_partial)

    def _stream_file(self, path: Path | str, chunk_ms: float, on_partial: PartialCallback | None) -> list[Segment]:
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
        try:
            self._stream_samples(samples, step, str(path), on_partial)
            return self._finish(path)
        except NonFiniteFeaturesError as error:
            raise AudioError(path, str(error)) from error
        finally:
            self._new_utterance()

    def _stream_samples(self, samples: np.ndarray, step: int, source: str, on_partial: PartialCallback | None
                        ) -> None:
        """Accept ``samples`` ``step`` at a time, calling ``on_partial(seconds, text)`` whenever the text changes."""
        shown = ""
        for start in range(0, len(samples), step):
            partial = self._accept(samples[start:start + step], source)
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
