"""Streaming recognition with a causal transducer: audio in, chunk by chunk; a partial transcript out after each.

    from ssm_fairseq.streaming.transcriber import StreamingTranscriber
    stream = StreamingTranscriber("checkpoint_avg3.pt", beam=4)
    for samples in microphone_chunks():        # 16 kHz mono float32 in [-1, 1], any chunk size
        print(stream.accept_waveform(samples))  # the best hypothesis so far, in words
    text, words = stream.finish()              # the final transcript (and, with timestamps=True, its words
                                               # as TimedWord(word, start, end)); the next sample starts anew

Each chunk goes through the filterbank (``StreamingFilterbank``), the config's feature transforms, the encoder's
``step`` (every SSM carries its state from chunk to chunk: the work per chunk does not grow with the stream) and a
search that keeps its hypotheses between chunks (``TransducerGenerator.search``). So the final transcript is the one
``Transcriber`` gives offline for the same audio, whatever the chunk sizes, up to float rounding (the recurrence
and the offline FFT convolution round differently: a near tie between two units could go either way; identical in
the tests); only how early partial results appear depends on the chunks. The model must have a causal encoder
(``--causal-encoder``, e.g. ``--arch mssm_transducer_streaming``) and its data directory per-frame feature
transforms (global CMVN, prepared with ``--cmvn global``): utterance CMVN needs the whole utterance.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..audio_features import AudioError, SAMPLE_RATE, read_16k_mono
from ..transcribe import TimedTranscript, Transcriber
from .filterbank import StreamingFilterbank

PER_FRAME_TRANSFORMS = ("GlobalCMVN",)  # feature transforms that treat every frame alone
PartialCallback = Callable[[float, str], None]


class StreamingTranscriber:
    """A causal transducer checkpoint loaded once, transcribing one stream at a time.

    Arguments as ``Transcriber``'s (``checkpoint``, ``data_dir``, ``device``, ``beam``, ``search``,
    ``max_symbols_per_frame``, ``lenpen``, ``blank_penalty``, ``precision``, ``lm_path``, ``lm_weight``,
    ``lm_eos``); ``timestamps``: time the final transcript's words (needs a config without a pre-tokenizer; off:
    ``finish`` gives no words). Raises ``ValueError`` for a model whose encoder cannot run chunk by chunk or a data
    directory whose feature transforms need the whole utterance.
    """

    def __init__(self, checkpoint: Path | str, timestamps: bool = False, **options):
        self.offline = Transcriber(checkpoint, **options)
        self.timestamps = timestamps
        model = self.offline.model
        model.encoder.check_streamable()
        transforms = [] if self.offline.feature_transforms is None else self.offline.feature_transforms.transforms
        for transform in transforms:
            if type(transform).__name__ not in PER_FRAME_TRANSFORMS:
                raise ValueError(f"the data directory's config.yaml applies {type(transform).__name__}, which needs "
                                 "the whole utterance: streaming needs per-frame transforms (prepare the data with "
                                 "--cmvn global, and train on it)")
        self.dtype = self.offline.generator.model_dtype()
        self.reset()

    def reset(self) -> None:
        """Forget the current stream: the next sample starts a new utterance."""
        self.filterbank = StreamingFilterbank()
        self.encoder_cache: dict = {}
        self.search = self.offline.generator.search(1, self.offline.device)

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

    def accept_waveform(self, samples: np.ndarray | torch.Tensor) -> str:
        """The next samples of the stream (1-D, 16 kHz mono, float in [-1, 1]) -> the partial transcript: the best
        hypothesis over the encoder frames complete so far, in words."""
        self._advance(self.filterbank.accept_waveform(samples), final=False)
        return self.offline.text(self.search.partial()[0].tokens)

    def finish(self) -> TimedTranscript:
        """End the stream: ``TimedTranscript(text, words)``, the final transcript and its words with their start
        and end times in seconds from the stream's start (``Transcriber.timed_words``). The next sample accepted
        starts a new utterance."""
        duration = self.seconds_accepted
        self._advance(np.zeros((0, StreamingFilterbank.num_mel_bins), dtype=np.float32), final=True)
        (best, *_), = self.search.finish(1, self.offline.generator.length_norm)
        self.reset()
        if not math.isfinite(best.score):
            raise ValueError(f"the hypothesis score is not finite (NaN or inf): the {self.dtype} model computed NaN "
                             "or inf")
        words = self.offline.timed_words(best.tokens, best.frames, duration) if self.timestamps else []
        return TimedTranscript(self.offline.text(best.tokens), words)

    def stream_file(self, path: Path | str, chunk_ms: int, on_partial: PartialCallback | None = None
                    ) -> TimedTranscript:
        """Transcribe an audio file (any format, rate and channels ``Transcriber`` reads) as a stream of
        ``chunk_ms`` chunks, as fast as they decode; ``on_partial(seconds, text)`` is called whenever the partial
        transcript changes, with the audio time it is at. Raises ``AudioError`` naming a bad file (NaN or inf
        samples too)."""
        if chunk_ms < 1:
            raise ValueError(f"chunk_ms must be at least 1, got {chunk_ms}")
        samples, _ = read_16k_mono(path)
        if not np.isfinite(samples).all():
            raise AudioError(path, "samples are not finite (NaN or inf in the audio)")
        self.reset()
        step, shown = max(1, chunk_ms * SAMPLE_RATE // 1000), ""
        try:
            for start in range(0, len(samples), step):
                partial = self.accept_waveform(samples[start:start + step])
                if partial != shown and on_partial is not None:
                    on_partial(self.seconds_accepted, partial)
                shown = partial
            return self.finish()
        except ValueError as error:
            self.reset()
            raise AudioError(path, str(error)) from error
