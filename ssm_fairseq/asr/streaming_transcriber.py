"""Streaming recognition with a causal transducer, one stream at a time: a ``Recognizer`` and one ``Stream`` on it.

    from ssm_fairseq.asr.streaming_transcriber import StreamingTranscriber
    stream = StreamingTranscriber("checkpoint_avg3.pt", beam=4)
    for samples in microphone_chunks():        # 16 kHz mono float32 in [-1, 1], any chunk size
        print(stream.accept_waveform(samples))  # the best hypothesis so far, in words
    text, words = stream.finish()              # the final transcript (and, with timestamps=True, its words
                                               # as TimedWord(word, start, end)); the next sample starts anew
    text, words = stream.stream_file("a.flac", 320)  # a whole file as a stream of 320 ms chunks

A convenience for one source: ``accept_waveform``, ``finish``, ``reset``, ``stream_file`` and ``seconds_accepted``
are its ``Stream``'s (``ssm_fairseq.asr.stream``, which describes the rules: one utterance and one call at a time,
``source`` checks, streamed = offline); ``offline`` is the ``Recognizer`` (``Transcriber``) that loaded the model.
For several concurrent streams, load one ``Recognizer`` and open a ``Stream`` per source with
``recognizer.stream()``: they share the model. The model must have a causal encoder (``--causal-encoder``, e.g.
``--arch mssm_transducer_streaming``) and its data directory per-frame feature transforms (global CMVN, prepared
with ``--cmvn global``): utterance CMVN needs the whole utterance.
"""
from __future__ import annotations

from pathlib import Path
from typing import Hashable

import numpy as np
import torch

from .endpoints import EndpointRules
from .recognizer import Recognizer
from .samples import SampleRangeError, check_sample_range, chunk_samples
from .stream import ConcurrentCallError, PartialCallback, StreamInProgressError
from .transcripts import Segment, TimedTranscript

__all__ = ["StreamingTranscriber", "StreamInProgressError", "ConcurrentCallError", "SampleRangeError",
           "chunk_samples", "check_sample_range", "PartialCallback"]


class StreamingTranscriber:
    """A causal transducer checkpoint loaded once (``offline``, a ``Recognizer``), transcribing one stream at a time.

    Arguments as ``Recognizer``'s (``checkpoint``, ``data_dir``, ``device``, ``beam``, ``search``,
    ``max_symbols_per_frame``, ``lenpen``, ``blank_penalty``, ``precision``, ``lm_path``, ``lm_weight``,
    ``lm_eos``); ``timestamps``: time the final transcript's words (needs a config without a pre-tokenizer; off:
    ``finish`` gives no words); ``endpoints``: cut the stream into segments by these rules
    (``ssm_fairseq.asr.endpoints``; ``finish_segments``, ``stream_file_segments``). Raises ``ValueError`` for a
    model whose encoder cannot run chunk by chunk, a data directory whose feature transforms need the whole
    utterance, or timestamps with a pre-tokenizer.
    """

    def __init__(self, checkpoint: Path | str, timestamps: bool = False, endpoints: EndpointRules | None = None,
                 **options):
        self.offline = Recognizer(checkpoint, **options)
        self.stream = self.offline.stream(timestamps, endpoints)

    @property
    def seconds_accepted(self) -> float:
        """Audio accepted so far in this stream, in seconds."""
        return self.stream.seconds_accepted

    def accept_waveform(self, samples: np.ndarray | torch.Tensor, source: Hashable | None = None) -> str:
        """``Stream.accept_waveform``: the next samples -> the partial transcript."""
        return self.stream.accept_waveform(samples, source)

    def finish(self) -> TimedTranscript:
        """``Stream.finish``: end the stream -> ``TimedTranscript(text, words)``."""
        return self.stream.finish()

    def finish_segments(self) -> list[Segment]:
        """``Stream.finish_segments``: end the stream -> its segments."""
        return self.stream.finish_segments()

    def reset(self) -> None:
        """``Stream.reset``: discard the stream in progress, if any."""
        self.stream.reset()

    def stream_file(self, path: Path | str, chunk_ms: float, on_partial: PartialCallback | None = None
                    ) -> TimedTranscript:
        """``Stream.stream_file``: an audio file as a stream of ``chunk_ms`` chunks -> its final transcript."""
        return self.stream.stream_file(path, chunk_ms, on_partial)

    def stream_file_segments(self, path: Path | str, chunk_ms: float, on_partial: PartialCallback | None = None
                             ) -> list[Segment]:
        """``Stream.stream_file_segments``: an audio file as a stream of ``chunk_ms`` chunks -> its segments."""
        return self.stream.stream_file_segments(path, chunk_ms, on_partial)
