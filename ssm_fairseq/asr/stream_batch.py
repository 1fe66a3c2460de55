"""Many live streams stepped as one batch through the causal encoder: ``Recognizer.step_streams``.

    recognizer = Recognizer("checkpoint_avg3.pt")
    streams = {call: recognizer.stream() for call in calls}          # streams join whenever they are opened
    while calls:
        chunks = {streams[call]: call.next_samples() for call in calls_with_audio}  # any subset, any chunk sizes
        partials = recognizer.step_streams(chunks)                   # {stream: partial transcript}
        for call in calls_that_hung_up:
            text, words = streams.pop(call).finish()                 # a stream leaves whenever it is finished

Each stream's chunk goes through its own filterbank and the feature transforms, and its frames wait in the stream
until they fill whole sub-sampling groups (``Stream.encoder_input``). The streams that have frames for the encoder
are then grouped by how many frames they have and the structure of their caches (``stack_key``: whether they have
started, since a stream's first encoder step builds its cache, and, with look-ahead, how many frames its buffer
holds, which grows to ``K`` over a stream's first frames); each group's ``S`` caches are stacked along the batch dimension (``stack_caches``), the group's ``S x
n x 80`` frames go through the encoder's ``step`` at once, and the ``S``-stream cache is split back
(``split_cache``). Streams fed chunks of one size (a server's usual 320 ms) are one group at every step, but for
those that joined at this step. Each stream's ``1 x m x D`` rows of the output then go through its own search,
which the search keeps between chunks, as for one stream (the searches stay one per stream: streams join and
leave at any step, and each search is resumable on its own).

Every stream's encoder frames, partial and final transcripts are thus those it gets alone (``Stream
.accept_waveform``), and its final transcript the offline one: stacking only puts the streams' rows side by
side, and each row of the encoder's batched matrix products, recurrences and LayerNorms is computed from its own
row; a batch's size may change how the arithmetic is blocked, which moves encoder outputs by float rounding
(about 1e-6 in float32). Endpoints (``Recognizer.stream(endpoints=...)``) work per stream as for one stream.

A stepped stream is held (``Stream.held``) for the whole step: a call on it from another thread meanwhile is
refused (``ConcurrentCallError``), as for one stream, and a stream held elsewhere refuses the step before any
stream has changed.

A stream whose features are not finite after the transforms (``NonFiniteFeaturesError``: the audio passed the
sample checks, but a transform made NaN or inf) fails alone: the other streams are stepped as without it, and the
step then raises ``StreamsFailedError`` with their partial transcripts (``partials``) and each failed stream's
error (``errors``, naming the stream's position and source); reset a failed stream (``Stream.reset``) before using
it again, as after that error on one stream.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Hashable, Mapping

import numpy as np
import torch

from .encoder.step_cache import split_cache, stack_caches, stack_key
from .features.transforms import NonFiniteFeaturesError

if TYPE_CHECKING:
    from .recognizer import Recognizer
    from .stream import Stream


class StreamsFailedError(ValueError):
    """Streams of a step that failed alone (their features were not finite); the others were stepped.

    ``errors``: each failed stream's ``NonFiniteFeaturesError``, whose note names its position in the step and its
    source; ``partials``: the other streams' partial transcripts, which ``step_streams`` would have returned."""

    def __init__(self, errors: dict[Stream, Exception], partials: dict[Stream, str]):
        super().__init__("; ".join(f"{error} {' '.join(getattr(error, '__notes__', []))}".strip()
                                   for error in errors.values())
                         + f" ({len(partials)} other stream(s) stepped: their partial transcripts are in .partials)")
        self.errors, self.partials = errors, partials


def step_streams(recognizer: Recognizer, chunks: Mapping[Stream, np.ndarray | torch.Tensor],
                 sources: Mapping[Stream, Hashable] | None = None) -> dict[Stream, str]:
    """Continue each stream of ``chunks`` (streams of ``recognizer``) with its samples (1-D, 16 kHz mono, float in
    [-1, 1], any length, empty too) -> each one's partial transcript, as ``Stream.accept_waveform`` gives it.

    ``sources``: each stream's source, as ``accept_waveform``'s ``source`` (missing: None). Every chunk is checked
    before any stream changes (``StreamInProgressError`` for another source's chunk, ``SampleRangeError`` and
    ``ValueError`` for samples that are beyond [-1, 1], not 1-D floats or not finite; the error's note names the
    stream's position in ``chunks``); ``ValueError`` for a stream of another recognizer. A stream whose features
    are not finite after the transforms fails alone: the others are stepped, then ``StreamsFailedError`` gives
    their partial transcripts (``partials``) and the failed streams' errors (``errors``; ``reset`` those streams).
    """
    sources = sources or {}
    streams = list(chunks)
    for position, stream in enumerate(streams):
        if stream.recognizer is not recognizer:
            raise ValueError(f"stream {position} of the step belongs to another Recognizer: a batch steps one model")
    with contextlib.ExitStack() as held:
        for stream in streams:
            held.enter_context(stream.held("step_streams"))
        for position, stream in enumerate(streams):
            if stream.pause_frames is not None:
                raise ValueError(f"stream {position} of the step ends segments at pauses "
                                 f"(EndpointRules.pause_seconds), which cuts inside a chunk: step it alone "
                                 f"(accept_waveform); no stream has changed")
        for position, stream in enumerate(streams):
            try:
                stream.check_chunk(chunks[stream], sources.get(stream))
            except (ValueError, RuntimeError) as error:  # RuntimeError: StreamInProgressError
                error.add_note(f"(the chunk of stream {position} of the step; no stream has changed)")
                raise
        errors: dict[Stream, Exception] = {}
        for position, stream in enumerate(streams):
            try:
                stream.take_samples(chunks[stream], sources.get(stream))
            except NonFiniteFeaturesError as error:
                error.add_note(f"(stream {position} of the step, source {sources.get(stream)!r}: reset() it; the "
                               f"other streams were stepped)")
                errors[stream] = error
        stepped = [stream for stream in streams if stream not in errors]
        encode_together(recognizer, stepped)
        partials = {stream: stream.partial_text() for stream in stepped}
        if errors:
            raise StreamsFailedError(errors, partials)
        return partials


def _group_key(stream: Stream, frames: np.ndarray) -> tuple[int, Hashable]:
    return len(frames), stack_key(stream.encoder_cache)


@torch.no_grad()
def encode_together(recognizer: Recognizer, streams: list[Stream]) -> None:
    """The frames each of ``streams`` has for the encoder (``Stream.encoder_input``, not final) through the encoder
    in as few batched steps as their frame counts and starts allow, each stream's output into its search."""
    groups: dict[tuple[int, Hashable], list[tuple[Stream, np.ndarray]]] = {}
    for stream in streams:
        frames = stream.encoder_input(final=False)
        if len(frames):
            groups.setdefault(_group_key(stream, frames), []).append((stream, frames))
    encoder = recognizer.model.encoder
    for members in groups.values():
        started = bool(members[0][0].encoder_cache)
        cache = stack_caches([stream.encoder_cache for stream, _ in members]) if started else {}
        features = torch.from_numpy(np.stack([frames for _, frames in members]))
        encoded = encoder.step(features.to(recognizer.device, recognizer.dtype), cache, False)
        for (stream, _), stream_cache, rows in zip(members, split_cache(cache, len(members)), encoded.split(1)):
            stream.encoder_cache = stream_cache
            stream.search_frames(rows)
