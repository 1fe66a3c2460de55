"""One transducer checkpoint loaded once, serving offline files and any number of streams.

    from ssm_fairseq.asr import Recognizer
    recognizer = Recognizer("checkpoint_avg10.pt", beam=4)       # model, dictionary, transforms, search: once
    texts = recognizer.transcribe(["a.flac", "b.wav"])            # files, batched as fairseq-generate batches
    a, b = recognizer.stream(), recognizer.stream()               # live streams sharing the model (causal models)
    a.accept_waveform(chunk_of_a); b.accept_waveform(chunk_of_b)  # each keeps its own state
    text, words = a.finish()
    partials = recognizer.step_streams({a: chunk_of_a, b: chunk_of_b})  # or: many streams as one batch

A ``Recognizer`` holds what is loaded once and read, never changed, by what it serves: the model in eval mode,
the dictionary, the config's feature transforms for evaluation splits, the generator (search settings, optional
LM), the detokenizer (and each unit's piece of text, which streams' partial transcripts join incrementally) and
the frame duration for timestamps. A ``Stream`` (``ssm_fairseq.asr.stream``) holds one
stream's state; ``step_streams`` steps many streams' encoders as one batch (``ssm_fairseq.asr.stream_batch``);
``ssm_fairseq.asr.offline`` decodes files in padded batches.
"""
from __future__ import annotations

import logging
from argparse import Namespace
from pathlib import Path
from typing import Hashable, Literal, Mapping, Sequence, overload

import numpy as np
import torch
from fairseq import tasks
from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform

from .features.audio_features import FRAME_SHIFT_SAMPLES, SAMPLE_RATE, AudioError, Conversions, filterbank_features
from ..integrity.checkpoint_checks import EVALUATION_SPLIT, naming_the_checkpoint
from ..integrity.language_model_check import load_language_model
from .search.bigram_lm import BigramLM
from .search.transducer_generator import TransducerGenerator
from .search.word_timestamps import TimedWord, word_timestamps
from .encoder.subsampling import subsampling_stride
from . import offline, stream_batch
from .checkpoint import load_checkpoint
from .endpoints import EndpointRules
from .features.transforms import (FeatureStream, NonFiniteFeaturesError, decoding_transforms,
                                  streaming_transform_problem, transformed)
from .incremental_text import unit_pieces
from .options import DecodingOptions, choose_device, precision_dtype
from .stream import Stream
from .transcripts import TimedTranscript

logger = logging.getLogger("ssm_fairseq.transcribe")  # the name ssm-transcribe's log lines have always had


class Recognizer:
    """A ``speech_transducer`` checkpoint loaded once: model, dictionary, feature transforms, search, detokenizer.

    Args:
        checkpoint: a ``fairseq-train --task speech_transducer`` checkpoint (``checkpoint_avgN.pt`` too).
        data_dir: the data directory to read ``config.yaml`` and the dictionary from (default: the checkpoint's).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ... (default: cuda if available, else cpu).
        options: ``DecodingOptions``' fields (``beam``, ``search``, ``max_symbols_per_frame``, ``lenpen``,
            ``blank_penalty``, ``max_tokens``, ``batch_size``, ``precision``, ``lm_path``, ``lm_weight``,
            ``lm_eos``). The LM is loaded with the data directory's ``dict.txt``, which must hold the units.

    ``frame_seconds`` is the time one encoder frame stands for (the sub-sampling stride x 10 ms, ``encoder_stride``
    filterbank frames), which turns emission frames into word times (``transcribe(paths, timestamps=True)``,
    ``timed_words``).
    """

    def __init__(self, checkpoint: Path | str, data_dir: Path | str | None = None,
                 device: str | torch.device | None = None, **options):
        self.options = DecodingOptions(**options)
        self.device = choose_device(device)
        # fp16/bf16 off: fairseq keeps the training run's --fp16 / --bf16 in the task config, where build_generator
        # would read them and convert the model; the precision is the options' alone
        state = load_checkpoint(checkpoint, data_dir, search=self.options.search, fp16=False, bf16=False,
                                max_symbols_per_frame=self.options.max_symbols_per_frame,
                                blank_penalty=self.options.blank_penalty, lm_eos=self.options.lm_eos)
        cfg = state["cfg"]
        self.task = tasks.setup_task(cfg.task)
        self.model = self._load_model(checkpoint, state)
        self.generator: TransducerGenerator = self._build_generator(cfg.task.data)
        self.dictionary = self.task.target_dictionary
        self.tokenizer = self.task.build_tokenizer(self.task.args)
        # each unit's piece of text, for streams' incremental partial transcripts (incremental_text)
        self.unit_pieces = unit_pieces(self.dictionary, self.generator.symbols_to_strip_from_output)
        self.feature_transforms = CompositeAudioFeatureTransform.from_config_dict(
            self.task.data_cfg.get_feature_transforms(EVALUATION_SPLIT, False))
        # the options' CMVN (cmvn_stats, cmvn_adapt_frames) in place of the config's, if they set one
        self.feature_transforms = decoding_transforms(self.feature_transforms, self.options.cmvn_stats,
                                                      self.options.cmvn_adapt_frames)
        self.max_frames = min(self.task.max_positions()[0], self.model.max_positions()[0])
        self.encoder_stride = subsampling_stride(self.model.cfg.subsampler, self.model.cfg.tr_stride)
        self.frame_seconds = self.encoder_stride * FRAME_SHIFT_SAMPLES / SAMPLE_RATE
        dtype = str(self.dtype).removeprefix("torch.")  # what decodes, not only what was asked
        lookahead = getattr(self.model.cfg, "lookahead_frames", 0)
        logger.info(f"{checkpoint}: {cfg.model._name}, {sum(p.numel() for p in self.model.parameters()):,} "
                    f"parameters, on {self.device} in {dtype}; {self.options.describe_search()}"
                    + (f"; look-ahead {lookahead} frames ({1000 * lookahead * self.frame_seconds:.0f} ms)"
                       if lookahead else "")
                    + (f"; {self.options.describe_cmvn()}" if self.options.describe_cmvn() else ""))

    def _load_model(self, checkpoint: Path | str, state: dict) -> torch.nn.Module:
        """The checkpoint's model with its weights, on this recognizer's device in its precision, in eval mode."""
        cfg = state["cfg"]
        with naming_the_checkpoint(str(checkpoint)):
            model = self.task.build_model(cfg.model, from_checkpoint=True)
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
        model.to(self.device)
        model.prepare_for_inference_(cfg)  # eval mode, as fairseq-generate prepares it
        return model.to(precision_dtype(self.options.precision))  # the generator casts the features to its dtype

    def _build_generator(self, data: str) -> TransducerGenerator:
        """The task's generator with the options' search, fused with the options' LM if any."""
        options = self.options
        lm = None if options.lm_path is None else load_language_model(options.lm_path, data, self.device)
        ilm = None if options.ilm_path is None else BigramLM.load(options.ilm_path)
        return self.task.build_generator([self.model], Namespace(beam=options.beam, nbest=1, lenpen=options.lenpen),
                                         extra_gen_cls_kwargs={"lm_model": lm, "lm_weight": options.lm_weight,
                                                               "ilm": ilm, "ilm_weight": options.ilm_weight})

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model decodes in (features are cast to it)."""
        return self.generator.model_dtype()

    def features(self, path: Path | str, conversions: Conversions | None = None) -> torch.Tensor:
        """``T x 80`` features of one audio file as the model saw them in training (filterbanks, then
        ``features.transformed``);
        ``conversions`` counts the file if it was not 16 kHz mono. Raises ``AudioError`` naming the file (NaN or
        inf samples too)."""
        fbank, conversion = filterbank_features(path)
        if conversions is not None:
            conversions.add(path, conversion)
        return self.utterance_features(fbank, path)

    def utterance_features(self, fbank: np.ndarray, path: Path | str, where: str = "") -> torch.Tensor:
        """``T x 80`` filterbank frames of one utterance (a file, or a piece of one) -> its features as the model saw
        them in training (``features.transformed``); ``AudioError`` naming ``path`` (and ``where`` in it) if they are
        not finite."""
        try:
            return torch.from_numpy(transformed(self.feature_transforms, fbank)).float()
        except NonFiniteFeaturesError as error:
            raise AudioError(path, f"{error}{where}") from error

    def transform_chunk(self, features: np.ndarray, stream_features: FeatureStream | None = None) -> np.ndarray:
        """A stream's next ``T x 80`` filterbank frames (``T`` may be 0) -> the ``T x 80`` features the model saw in
        training (``features.transformed``; ``NonFiniteFeaturesError`` unless finite), through the stream's own
        ``stream_features`` (``feature_stream()``), where causal transforms (adaptive CMVN) keep its statistics.
        Without it, per-frame transforms only: ``ValueError`` for transforms that keep statistics per stream."""
        if stream_features is None:
            problem = streaming_transform_problem(self.feature_transforms)
            if problem:
                raise ValueError(problem)
        transforms = self.feature_transforms if stream_features is None else stream_features
        return np.ascontiguousarray(transformed(transforms, features), dtype=np.float32)

    def feature_stream(self) -> FeatureStream:
        """A new stream's (or utterance's) state of the feature transforms, for ``transform_chunk``."""
        return FeatureStream(self.feature_transforms)

    def encode_chunk(self, features: np.ndarray, cache: dict, final: bool,
                     stream_features: FeatureStream | None = None) -> torch.Tensor:
        """A stream's next ``T x 80`` filterbank frames (``T`` may be 0) -> the ``1 x T' x D`` encoder frames they
        complete, through ``transform_chunk`` (with the stream's ``stream_features``; ``NonFiniteFeaturesError``)
        and ``encode_features``."""
        return self.encode_features(self.transform_chunk(features, stream_features), cache, final)

    @torch.no_grad()
    def encode_features(self, features: np.ndarray, cache: dict, final: bool) -> torch.Tensor:
        """A stream's next ``T x 80`` transformed frames (``transform_chunk``; ``T`` may be 0) -> the ``1 x T' x D``
        encoder frames they complete, through the causal encoder's ``step``; ``cache`` holds the stream's encoder
        state between calls (empty at its start), ``final`` ends it."""
        return self.model.encoder.step(torch.from_numpy(features).to(self.device, self.dtype).unsqueeze(0), cache,
                                       final)

    def streaming_problem(self) -> str | None:
        """Why this model and data directory cannot transcribe chunk by chunk (``stream``), or None: an encoder
        that needs the whole utterance, or feature transforms that do (utterance CMVN)."""
        try:
            self.model.encoder.check_streamable()
        except ValueError as error:
            return str(error)
        return streaming_transform_problem(self.feature_transforms, per_stream_state=True)  # Stream keeps one

    def stream(self, timestamps: bool = False, endpoints: EndpointRules | None = None) -> Stream:
        """A new ``Stream`` on this recognizer's model: make one per source (they share the model, not their
        state). ``timestamps``: time its final transcripts' words; ``endpoints``: cut it into segments by these
        rules (``ssm_fairseq.asr.endpoints``; None: one segment per utterance). Raises ``ValueError`` for a model
        or data directory that cannot stream (``streaming_problem``), or timestamps a pre-tokenizer prevents."""
        problem = self.streaming_problem()
        if problem:
            raise ValueError(problem)
        if timestamps:
            self.check_timestamps()
        return Stream(self, timestamps, endpoints)

    def step_streams(self, chunks: Mapping[Stream, np.ndarray | torch.Tensor],
                     sources: Mapping[Stream, Hashable] | None = None) -> dict[Stream, str]:
        """Continue each of this recognizer's streams in ``chunks`` with its samples, their encoders stepped as one
        batch -> each stream's partial transcript, the one ``stream.accept_waveform(samples, source)`` gives
        (``ssm_fairseq.asr.stream_batch.step_streams``, which says more). Streams join a step by having a chunk in
        it, and leave by ``finish``."""
        return stream_batch.step_streams(self, chunks, sources)

    @overload
    def transcribe(self, paths: Sequence[Path | str], timestamps: Literal[False] = False) -> list[str]: ...

    @overload
    def transcribe(self, paths: Sequence[Path | str], timestamps: Literal[True]) -> list[TimedTranscript]: ...

    def transcribe(self, paths: Sequence[Path | str], timestamps: bool = False) -> list[str] | list[TimedTranscript]:
        """The transcript (words) of each audio file, in the order of ``paths``, decoded in padded batches as
        ``fairseq-generate`` decodes a manifest (``ssm_fairseq.asr.offline.transcribe_files``, which says more).

        With ``timestamps=True``, a ``TimedTranscript(text, words)`` per file instead: the same transcript and its
        words as ``TimedWord(word, start, end)`` (seconds from the file's start, within ``[0, duration]``, in
        order). A file longer than ``window_seconds`` (30 s) is transcribed window by window in bounded memory
        (``long_form``): no length limit. Raises ``InputError`` naming every file that is missing, unreadable or
        empty before anything is decoded."""
        return offline.transcribe_files(self, paths, timestamps, self.options.windowing)

    def check_timestamps(self) -> None:
        """``ValueError`` if the config's pre-tokenizer rewrites the SentencePiece text (its words are timed)."""
        if self.tokenizer is not None:
            raise ValueError(f"timestamps time the words of the SentencePiece text; this config's pre_tokenizer "
                             f"{self.task.data_cfg.pre_tokenizer} rewrites them after decoding")

    def text(self, tokens: torch.Tensor | Sequence[int]) -> str:
        """Label ids -> words, as ``fairseq-generate --post-process sentencepiece`` makes its ``D-`` line (then the
        config's pre-tokenizer's decoding, if it has one)."""
        text = self.dictionary.string(torch.as_tensor(tokens, dtype=torch.int).cpu(), "sentencepiece",
                                      extra_symbols_to_ignore=self.generator.symbols_to_strip_from_output)
        return text if self.tokenizer is None else self.tokenizer.decode(text)

    def timed_words(self, tokens: Sequence[int], frames: Sequence[int],
                    duration: float | None = None, not_before: float = 0.0) -> list[TimedWord]:
        """Label ids and the encoder frame each was emitted at (a ``Hypothesis``'s ``tokens`` and ``frames``) -> the
        words of ``text(tokens)`` with their times in seconds (``word_timestamps`` at this model's
        ``frame_seconds``, clamped to ``[not_before, duration]``, ``duration`` when given). The ids ``text`` drops
        (``</s>``, ``<s>``) are dropped here too."""
        self.check_timestamps()
        if len(tokens) != len(frames):
            raise ValueError(f"{len(tokens)} tokens but {len(frames)} frames")
        dropped = set(self.generator.symbols_to_strip_from_output) | {self.dictionary.eos()}
        kept = [(int(token), frame) for token, frame in zip(tokens, frames) if int(token) not in dropped]
        return word_timestamps([self.dictionary[token] for token, _ in kept], [frame for _, frame in kept],
                               self.frame_seconds, duration, not_before)


@overload
def transcribe(paths: Sequence[Path | str], checkpoint: Path | str, *, timestamps: Literal[False] = False,
               **options) -> list[str]: ...


@overload
def transcribe(paths: Sequence[Path | str], checkpoint: Path | str, *, timestamps: Literal[True],
               **options) -> list[TimedTranscript]: ...


def transcribe(paths: Sequence[Path | str], checkpoint: Path | str, *, timestamps: bool = False,
               **options) -> list[str] | list[TimedTranscript]:
    """The transcript of each audio file in ``paths``, in order: ``Recognizer(checkpoint, **options)`` (see its
    arguments), then ``transcribe(paths, timestamps)``. Load a ``Recognizer`` once to transcribe several lists."""
    return Recognizer(checkpoint, **options).transcribe(paths, timestamps=timestamps)
