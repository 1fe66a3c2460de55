"""Audio files -> text with a trained transducer checkpoint, decoded as ``fairseq-generate`` decodes.

    ssm-transcribe --checkpoint exp/librispeech/checkpoints/mssm_transducer/checkpoint_avg10.pt a.flac b.wav ...

(the installed command; ``python -m ssm_fairseq.transcribe`` is the same) prints ``PATH<TAB>transcript`` for every
file, in the order given. ``--stream --chunk-ms 320`` decodes each file as a live stream instead, with a causal
model (``ssm_fairseq.streaming.transcriber``): the partial transcript goes to stderr whenever it changes
(``PATH [seconds] text``) and the same final lines to stdout. With ``--timestamps`` each line gets a third column,
the transcript's words with their times as a JSON list of ``[word, start, end]`` (seconds from the start of the
file, rounded to 0.01)::

    a.flac<TAB>HELLO WORLD<TAB>[["HELLO", 0.32, 0.6], ["WORLD", 0.64, 1.04]]

(JSON escapes any tab or line break, so a line splits on its first two tabs; the words are ``transcript.split()``,
so joined by single spaces they are the transcript, unless two word boundaries in a row left two spaces in it).
From Python::

    from ssm_fairseq.transcribe import Transcriber, transcribe
    texts = transcribe(["a.flac", "b.wav"], checkpoint="checkpoint_avg10.pt")  # loads the model, then decodes
    transcriber = Transcriber("checkpoint_avg10.pt", beam=4)  # load once, call many times
    texts = transcriber.transcribe(["a.flac"])
    timed = transcriber.transcribe(["a.flac"], timestamps=True)  # [TimedTranscript(text, words)]
    for word, start, end in timed[0].words: ...                   # TimedWord(word, start, end), seconds

A word's times are those of the encoder frames at which the search emitted its first and last units on the best
hypothesis's alignment (``fairseq-generate --print-alignment hard``'s frames): from the start of the first unit's
frame to the end of the last one's (one frame = the sub-sampling stride x 10 ms, e.g. 40 ms), clamped to the
file's duration. They are when the model decided on the word, which may lag the sound (see
``ssm_fairseq.generation.word_timestamps``).

The checkpoint (``--task speech_transducer``, any ``*_transducer`` architecture, averaged or not) names its data
directory and ``config.yaml``, which give the dictionary of SentencePiece units and the feature transforms;
``data_dir`` / ``--data-dir`` replaces that directory when the checkpoint has moved machines. Features are those of
training: ``ssm_fairseq.audio_features`` (any rate and channel count in, 16 kHz mono 80-dim filterbanks, the code
``scripts/prepare_librispeech.py`` runs), then the config's transforms for evaluation splits (utterance CMVN, ...)
through fairseq's own ``CompositeAudioFeatureTransform``; each kind of conversion to 16 kHz mono is logged with the
files it applied to (``Conversions``: converted audio gives other features). Files are sorted by length and padded
into batches of at most ``max_tokens`` frames (and ``batch_size`` files) as ``fairseq-generate`` batches a manifest,
and decoded by the task's ``TransducerGenerator``; the units become words as ``fairseq-generate --post-process
sentencepiece`` joins them (the recipe's WER). So a file gives the ``D-`` hypothesis ``fairseq-generate`` prints for
its features with the same search options and batches. Every file is checked before decoding: missing, unreadable,
empty or too long ones are all named in one error, and none is skipped (a file longer than the model's
``max_source_positions`` with what to do: stream it with a causal model, or split it). The command line refuses file
names holding a tab or a line break (they would break its ``PATH<TAB>transcript`` lines). The checkpoint is checked
as fairseq-generate checks it (``ssm_fairseq.checkpoint_checks``: CRCs, finite weights, and the dictionary it was
trained with against the data directory's).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Literal, NamedTuple, Sequence, overload

import numpy as np
import soundfile as sf
import torch
from fairseq import checkpoint_utils, tasks
from fairseq.data import data_utils
from fairseq.data.audio.data_cfg import S2TDataConfig
from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform
from torch.nn.utils.rnn import pad_sequence

from .audio_features import (FRAME_SHIFT_SAMPLES, NUM_MEL_BINS, SAMPLE_RATE, AudioError, Conversions,
                             audio_frames, filterbank_features)
from .checkpoint_checks import EVALUATION_SPLIT, naming_the_checkpoint
from .generation.hypothesis import MAX_SYMBOLS_PER_FRAME
from .generation.language_model_check import load_language_model
from .generation.transducer_generator import NonFiniteScoreError
from .generation.word_timestamps import TimedWord, word_timestamps
from .modules.subsampling import subsampling_stride
from .tasks.speech_transducer import SEARCHES

logger = logging.getLogger("ssm_fairseq.transcribe")

DEFAULT_MAX_TOKENS = 12000  # fairseq-generate's when neither --max-tokens nor --batch-size is given
PRECISIONS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PER_FRAME_TRANSFORMS = ("GlobalCMVN",)  # feature transforms that treat every frame alone: they can stream


class TimedTranscript(NamedTuple):
    """One file's transcript and its words with their times: ``[w.word for w in words] == text.split()``, so
    ``" ".join(w.word for w in words) == text`` unless the search emitted two word boundaries in a row (a lone
    ``"▁"`` unit after a word-initial one), which leaves two spaces in ``text`` (as in fairseq-generate's ``D-``
    line)."""

    text: str
    words: list[TimedWord]


class InputError(ValueError):
    """Audio files that cannot be transcribed, one line each naming the file."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def load_checkpoint(checkpoint: Path | str, data_dir: Path | str | None = None, **task_overrides) -> dict:
    """A ``speech_transducer`` checkpoint's state (on CPU), its task config pointing at a data directory that
    holds ``config.yaml`` and the dictionary of SentencePiece units it names (the units' strings are all that
    decoding needs: the SentencePiece model itself is not read).

    ``data_dir`` replaces the checkpoint's ``data``; ``task_overrides`` set other task options (the search's).
    Raises ``FileNotFoundError`` naming the first missing file, ``ValueError`` for a checkpoint of another task.
    """
    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    overrides = dict(task_overrides, **({"data": str(data_dir)} if data_dir is not None else {}))
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint), arg_overrides=overrides)
    task_cfg = state["cfg"].task
    task_name = getattr(task_cfg, "_name", None)
    if task_name != "speech_transducer":
        raise ValueError(f"{checkpoint}: a checkpoint of --task {task_name}; transcription needs a "
                         f"--task speech_transducer checkpoint")
    root = Path(task_cfg.data)
    where = ("(--data-dir)" if data_dir is not None else
             "(the checkpoint's data directory; pass --data-dir if the data has moved)")
    config = root / task_cfg.config_yaml
    if not config.is_file():
        raise FileNotFoundError(f"{config}: config not found {where}")
    data_cfg = S2TDataConfig(config)
    dictionary = root / data_cfg.vocab_filename
    if not dictionary.is_file():
        raise FileNotFoundError(f"{dictionary}: the dictionary {config} names, not found {where}")
    if data_cfg.bpe_tokenizer.get("bpe") != "sentencepiece":
        raise ValueError(f"{config}: transcription turns SentencePiece units into words; this config's "
                         f"bpe_tokenizer is {data_cfg.bpe_tokenizer}")
    model_input = ("waveforms (use_audio_input)" if data_cfg.use_audio_input
                   else f"{data_cfg.input_feat_per_channel}-dim features (input_feat_per_channel)")
    if data_cfg.use_audio_input or data_cfg.input_feat_per_channel != NUM_MEL_BINS:
        raise ValueError(f"{config}: the model reads {model_input}; transcription computes the "
                         f"{NUM_MEL_BINS}-dim filterbanks of scripts/prepare_librispeech.py")
    return state


def _check_options(beam: int, max_symbols_per_frame: int, max_tokens: int | None, batch_size: int | None,
                   search: str, precision: str) -> None:
    """``ValueError`` naming the first of ``Transcriber``'s options out of its range."""
    for name, value in [("beam", beam), ("max_symbols_per_frame", max_symbols_per_frame),
                        ("max_tokens", max_tokens), ("batch_size", batch_size)]:
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {SEARCHES}, got {search!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")


def _device(device: str | torch.device | None) -> torch.device:
    """``device``, by default cuda if available, else cpu; ``ValueError`` for cuda where there is none."""
    chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {chosen} asked for, but CUDA is not available here (--cpu decodes on CPU)")
    return chosen


class Transcriber:
    """A transducer checkpoint loaded once (model, dictionary, feature transforms, search).

    Args:
        checkpoint: a ``fairseq-train --task speech_transducer`` checkpoint (``checkpoint_avgN.pt`` too).
        data_dir: the data directory to read ``config.yaml`` and the dictionary from
            (default: the checkpoint's).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ... (default: cuda if available, else cpu).
        beam: 1 for greedy search, more for beam search (default 4, as the recipe decodes).
        search: ``"exact"`` (frame-synchronous, up to ``max_symbols_per_frame`` labels per frame) or
            ``"modified"`` (one label per frame).
        max_symbols_per_frame, blank_penalty, lenpen: as ``fairseq-generate``'s ``--max-symbols-per-frame``,
            ``--blank-penalty`` and ``--lenpen``.
        max_tokens: most feature frames (10 ms each) in a padded batch; default 12000, as ``fairseq-generate``,
            unless ``batch_size`` alone is given.
        batch_size: most files in a batch.
        precision: ``"float32"`` (default), ``"float16"`` or ``"bfloat16"``: the dtype the model decodes in, as
            ``fairseq-generate --fp16`` / ``--bf16`` (the joiner's log-softmax and the scores stay float32).
        lm_path, lm_weight, lm_eos: shallow fusion with a fairseq language model, as ``fairseq-generate --lm-path
            --lm-weight`` (and ``--no-lm-eos`` for ``lm_eos=False``): the LM is loaded with the data directory's
            ``dict.txt``, which must hold the transducer's units. The LM stays in float32.

    ``frame_seconds`` is the time one encoder frame stands for (the sub-sampling stride x 10 ms), which turns
    emission frames into word times (``transcribe(paths, timestamps=True)``, ``timed_words``).
    """

    def __init__(self, checkpoint: Path | str, data_dir: Path | str | None = None,
                 device: str | torch.device | None = None, beam: int = 4, search: str = "exact",
                 max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME, lenpen: float = 1.0, blank_penalty: float = 0.0,
                 max_tokens: int | None = None, batch_size: int | None = None, precision: str = "float32",
                 lm_path: Path | str | None = None, lm_weight: float = 0.0, lm_eos: bool = True):
        _check_options(beam=beam, max_symbols_per_frame=max_symbols_per_frame, max_tokens=max_tokens,
                       batch_size=batch_size, search=search, precision=precision)
        self.max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None and batch_size is None else max_tokens
        self.batch_size = batch_size
        self.device = _device(device)
        # fp16/bf16 off: fairseq keeps the training run's --fp16 / --bf16 in the task config, where build_generator
        # would read them and convert the model; the precision is this argument's alone
        state = load_checkpoint(checkpoint, data_dir, search=search, max_symbols_per_frame=max_symbols_per_frame,
                                blank_penalty=blank_penalty, lm_eos=lm_eos, fp16=False, bf16=False)
        cfg = state["cfg"]
        self.task = tasks.setup_task(cfg.task)
        self.model = self._load_model(checkpoint, state, PRECISIONS[precision])
        lm = None if lm_path is None else load_language_model(lm_path, cfg.task.data, self.device)
        self.generator = self.task.build_generator([self.model], Namespace(beam=beam, nbest=1, lenpen=lenpen),
                                                   extra_gen_cls_kwargs={"lm_model": lm, "lm_weight": lm_weight})
        self.dictionary = self.task.target_dictionary
        self.tokenizer = self.task.build_tokenizer(self.task.args)
        self.feature_transforms = CompositeAudioFeatureTransform.from_config_dict(
            self.task.data_cfg.get_feature_transforms(EVALUATION_SPLIT, False))
        self.max_frames = min(self.task.max_positions()[0], self.model.max_positions()[0])
        model_cfg = self.model.cfg  # seconds per encoder frame, for timestamps
        self.frame_seconds = (subsampling_stride(model_cfg.subsampler, model_cfg.tr_stride) * FRAME_SHIFT_SAMPLES
                              / SAMPLE_RATE)
        searching = "greedy search" if beam == 1 else f"beam {beam}, {search} search"
        if lm is not None:
            searching += f", fused with {lm_path} (weight {lm_weight})"
        dtype = str(self.generator.model_dtype()).removeprefix("torch.")  # what decodes, not only what was asked
        logger.info(f"{checkpoint}: {cfg.model._name}, {sum(p.numel() for p in self.model.parameters()):,} "
                    f"parameters, on {self.device} in {dtype}; {searching}")

    def _load_model(self, checkpoint: Path | str, state: dict, dtype: torch.dtype) -> torch.nn.Module:
        """The checkpoint's model with its weights, on this transcriber's device in ``dtype``, in eval mode."""
        cfg = state["cfg"]
        with naming_the_checkpoint(str(checkpoint)):
            model = self.task.build_model(cfg.model, from_checkpoint=True)
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
        model.to(self.device)
        model.prepare_for_inference_(cfg)  # eval mode, as fairseq-generate prepares it
        return model.to(dtype)  # the generator casts the features to the model's dtype

    def features(self, path: Path | str, conversions: Conversions | None = None) -> torch.Tensor:
        """``T x 80`` features of one audio file as the model saw them in training: filterbanks, then the
        config's transforms for evaluation splits; ``conversions`` counts the file if it was not 16 kHz mono.
        Raises ``AudioError`` naming the file (NaN or inf samples too)."""
        fbank, conversion = filterbank_features(path)
        if conversions is not None:
            conversions.add(path, conversion)
        if self.feature_transforms is not None:
            fbank = self.feature_transforms(fbank)
        if not np.isfinite(fbank).all():
            raise AudioError(path, "features are not finite (NaN or inf in the audio)")
        return torch.from_numpy(fbank).float()

    @overload
    def transcribe(self, paths: Sequence[Path | str], timestamps: Literal[False] = False) -> list[str]: ...

    @overload
    def transcribe(self, paths: Sequence[Path | str], timestamps: Literal[True]) -> list[TimedTranscript]: ...

    def transcribe(self, paths: Sequence[Path | str], timestamps: bool = False) -> list[str] | list[TimedTranscript]:
        """The transcript (words) of each audio file, in the order of ``paths``.

        With ``timestamps=True``, a ``TimedTranscript(text, words)`` per file instead: the same transcript and its
        words as ``TimedWord(word, start, end)`` (seconds from the file's start, within ``[0, duration]``, in
        order), timed by the encoder frames of their units on the best hypothesis's alignment
        (``ssm_fairseq.generation.word_timestamps``). Needs a config without a ``pre_tokenizer`` (words are then
        exactly the SentencePiece text's).

        Raises ``InputError`` naming every file that is missing, unreadable, empty or longer than the model's
        ``max_source_positions`` (or than ``max_tokens``) before anything is decoded. Files that are not 16 kHz
        mono are converted and logged, one line per kind of conversion (``Conversions``).
        """
        if isinstance(paths, (str, Path)):
            raise TypeError(f"transcribe takes a list of paths, got the single path {paths!r}")
        if timestamps:
            self.check_timestamps()
        if not paths:
            return []
        frames = np.array(self._frames(paths), dtype=np.int64)
        order = np.lexsort((np.arange(len(paths)), -frames))  # longest first, as fairseq orders a manifest
        batches = data_utils.batch_by_size(order, num_tokens_fn=frames.__getitem__, max_tokens=self.max_tokens,
                                           max_sentences=self.batch_size)
        texts: list[str | TimedTranscript | None] = [None] * len(paths)
        done, every, conversions = 0, max(1, len(batches) // 10), Conversions()
        for n, batch in enumerate(batches, 1):
            try:
                decoded = self._decode(batch, [self.features(paths[i], conversions) for i in batch],
                                       [_duration(paths[i]) for i in batch] if timestamps else None)
            except NonFiniteScoreError as error:  # sample ids are indices of paths
                raise InputError([f"{paths[i]}: {error.reason}" for i in error.ids]) from error
            for index, text in zip(batch, decoded):
                texts[index] = text
            done += len(batch)
            if n % every == 0 or n == len(batches):
                logger.info(f"{done}/{len(paths)} files transcribed ({n}/{len(batches)} batches)")
        conversions.log(logger)
        return texts

    def _frames(self, paths: Sequence[Path | str]) -> list[int]:
        """Feature frames of every file (from its header), or ``InputError`` listing every bad file."""
        frames, problems = [], []
        for path in paths:
            try:
                frames.append(audio_frames(path))
            except AudioError as error:
                problems.append(str(error))
                continue
            too_long = self._too_long(path, frames[-1])
            if too_long:
                problems.append(too_long)
        if problems:
            raise InputError(problems)
        return frames

    def _too_long(self, path: Path | str, frames: int) -> str | None:
        """What to do with a file of ``frames`` feature frames longer than a batch may be, or None if it fits."""
        length = f"{path}: {frames / 100:.1f} s of audio ({frames} feature frames)"
        if frames > self.max_frames:
            problem = self.streaming_problem()
            advice = (f"split it into pieces of at most {self.max_frames // 100} s (this model cannot stream it: "
                      f"{problem})" if problem else
                      "stream it, which has no length limit (ssm-transcribe --stream; StreamingTranscriber from "
                      f"Python), or split it into pieces of at most {self.max_frames // 100} s")
            return (f"{length}, longer than this model transcribes offline: {self.max_frames / 100:.1f} s "
                    f"({self.max_frames} frames, its max_source_positions); {advice}")
        if self.max_tokens is not None and frames > self.max_tokens:
            return (f"{length}, more than a batch holds (max_tokens, --max-tokens {self.max_tokens}): raise "
                    f"--max-tokens to at least {frames}")
        return None

    def streaming_problem(self) -> str | None:
        """Why this model and data directory cannot transcribe chunk by chunk (``StreamingTranscriber``), or None:
        an encoder that needs the whole utterance, or feature transforms that do (utterance CMVN)."""
        try:
            self.model.encoder.check_streamable()
        except ValueError as error:
            return str(error)
        transforms = [] if self.feature_transforms is None else self.feature_transforms.transforms
        for transform in transforms:
            if type(transform).__name__ not in PER_FRAME_TRANSFORMS:
                return (f"the data directory's config.yaml applies {type(transform).__name__}, which needs the whole "
                        "utterance: streaming needs per-frame transforms (prepare the data with --cmvn global, and "
                        "train on it)")
        return None

    def _decode(self, ids: Sequence[int], features: list[torch.Tensor],
                durations: list[float] | None = None) -> list[str] | list[TimedTranscript]:
        """The features of files ``ids`` -> their transcripts, decoded as one padded batch (zeros after each end,
        longest first, as fairseq's collater pads a batch); with the files' ``durations`` (seconds), their
        ``TimedTranscript``s."""
        lengths, order = torch.tensor([f.shape[0] for f in features]).sort(descending=True)
        sample = {"id": torch.tensor(ids)[order], "net_input": {
            "src_tokens": pad_sequence([features[i] for i in order], batch_first=True).to(self.device),
            "src_lengths": lengths.to(self.device)}}
        hypotheses = self.task.inference_step(self.generator, [self.model], sample)
        texts = [""] * len(features)
        for i, best in zip(order.tolist(), hypotheses):
            texts[i] = self.text(best[0]["tokens"])
            if durations is not None:  # the alignment: (encoder frame, token index) per label, </s> not included
                tokens = best[0]["tokens"].tolist()
                aligned = [(frame, tokens[index]) for frame, index in best[0]["alignment"]]
                texts[i] = TimedTranscript(texts[i], self.timed_words([token for _, token in aligned],
                                                                      [frame for frame, _ in aligned], durations[i]))
        return texts

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
                    duration: float | None = None) -> list[TimedWord]:
        """Label ids and the encoder frame each was emitted at (a ``Hypothesis``'s ``tokens`` and ``frames``) -> the
        words of ``text(tokens)`` with their times in seconds (``word_timestamps`` at this model's
        ``frame_seconds``, clamped to ``duration`` when given). The ids ``text`` drops (``</s>``, ``<s>``) are
        dropped here too."""
        self.check_timestamps()
        if len(tokens) != len(frames):
            raise ValueError(f"{len(tokens)} tokens but {len(frames)} frames")
        dropped = set(self.generator.symbols_to_strip_from_output) | {self.dictionary.eos()}
        kept = [(int(token), frame) for token, frame in zip(tokens, frames) if int(token) not in dropped]
        return word_timestamps([self.dictionary[token] for token, _ in kept], [frame for _, frame in kept],
                               self.frame_seconds, duration)


def _duration(path: Path | str) -> float:
    """Seconds of audio in a file (checked readable before), from its header."""
    info = sf.info(str(path))
    return info.frames / info.samplerate


@overload
def transcribe(paths: Sequence[Path | str], checkpoint: Path | str, *, timestamps: Literal[False] = False,
               **options) -> list[str]: ...


@overload
def transcribe(paths: Sequence[Path | str], checkpoint: Path | str, *, timestamps: Literal[True],
               **options) -> list[TimedTranscript]: ...


def transcribe(paths: Sequence[Path | str], checkpoint: Path | str, *, timestamps: bool = False,
               **options) -> list[str] | list[TimedTranscript]:
    """The transcript of each audio file in ``paths``, in order: ``Transcriber(checkpoint, **options)`` (see its
    arguments), then ``transcribe(paths, timestamps)``. Load a ``Transcriber`` once to transcribe several lists."""
    return Transcriber(checkpoint, **options).transcribe(paths, timestamps=timestamps)


def timed_words_json(words: Sequence[TimedWord]) -> str:
    """``--timestamps``' third column: ``[[word, start, end], ...]`` in seconds rounded to 0.01, on one line."""
    return json.dumps([[w.word, round(w.start, 2), round(w.end, 2)] for w in words], ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ssm-transcribe",
                                     description="Transcribe audio files with a speech_transducer checkpoint: "
                                                 "prints PATH<TAB>transcript per file, in input order "
                                                 "(PATH<TAB>transcript<TAB>timed words with --timestamps).")
    parser.add_argument("audio", nargs="+", help="audio files (any format soundfile reads, any rate and channels)")
    parser.add_argument("--checkpoint", required=True, help="fairseq-train --task speech_transducer checkpoint")
    parser.add_argument("--data-dir", default=None,
                        help="data directory with config.yaml and the dictionary "
                             "(default: the one the checkpoint was trained on)")
    parser.add_argument("--beam", type=int, default=4, help="1: greedy search; N: beam search (default 4)")
    parser.add_argument("--search", choices=SEARCHES, default="exact",
                        help="exact: frame-synchronous search; modified: one label per frame")
    parser.add_argument("--max-symbols-per-frame", type=int, default=MAX_SYMBOLS_PER_FRAME, metavar="N",
                        help=f"labels a hypothesis may emit within one encoder frame (default {MAX_SYMBOLS_PER_FRAME})")
    parser.add_argument("--lenpen", type=float, default=1.0,
                        help="beam search ranks final hypotheses by score / (labels + 1) ** lenpen (default 1)")
    parser.add_argument("--blank-penalty", type=float, default=0.0, metavar="P",
                        help="subtract P from the blank's logit during search (default 0)")
    parser.add_argument("--lm-path", default=None,
                        help="a fairseq language model over the transducer's units, fused into the search")
    parser.add_argument("--lm-weight", type=float, default=0.0, help="the language model's weight (default 0)")
    parser.add_argument("--lm-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="add the LM's end-of-sentence score to finished hypotheses (default: on)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"most feature frames (10 ms) in a batch (default {DEFAULT_MAX_TOKENS} unless "
                             "--batch-size is given)")
    parser.add_argument("--batch-size", type=int, default=None, help="most files in a batch")
    parser.add_argument("--timestamps", action="store_true",
                        help="add a third column: the words with their times, a JSON list of [word, start, end] in "
                             "seconds (rounded to 0.01), from the encoder frames at which the search emitted each "
                             "word's first and last units (when the model decided, which may lag the sound)")
    parser.add_argument("--stream", action="store_true",
                        help="decode each file as a live stream, chunk by chunk (a causal model trained on global "
                             "CMVN, e.g. --arch mssm_transducer_streaming): the partial transcript goes to stderr "
                             "whenever it changes, the final lines to stdout as without --stream; no length limit, "
                             "and --max-tokens / --batch-size do not apply (one file at a time)")
    parser.add_argument("--chunk-ms", type=float, default=None,
                        help="with --stream: milliseconds of audio per chunk, rounded to whole samples (default 320)")
    parser.add_argument("--cpu", action="store_true", help="decode on CPU even if CUDA is available")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_const", const="float16", dest="precision", default="float32",
                           help="decode in float16, as fairseq-generate --fp16")
    precision.add_argument("--bf16", action="store_const", const="bfloat16", dest="precision",
                           help="decode in bfloat16, as fairseq-generate --bf16")
    args = parser.parse_args(argv)
    unprintable = [path for path in args.audio if any(c in path for c in "\t\n\r")]
    if unprintable:
        parser.error(f"{unprintable[0]!r}: a file name holding a tab or a line break cannot be printed as "
                     f"PATH<TAB>transcript; rename the file (or call ssm_fairseq.transcribe.transcribe from Python)")
    if args.chunk_ms is not None and not args.stream:
        parser.error("--chunk-ms sets the chunks of --stream; add --stream")
    if args.chunk_ms is not None:
        from .streaming.transcriber import chunk_samples  # it builds on this module

        try:
            chunk_samples(args.chunk_ms)
        except ValueError as error:
            parser.error(f"--chunk-ms: {error}")
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr, force=True)  # force: importing fairseq configured logging already
    if args.stream:
        return _stream_main(args)
    try:
        transcriber = Transcriber(args.checkpoint, data_dir=args.data_dir, device="cpu" if args.cpu else None,
                                  beam=args.beam, search=args.search, max_symbols_per_frame=args.max_symbols_per_frame,
                                  lenpen=args.lenpen, blank_penalty=args.blank_penalty, max_tokens=args.max_tokens,
                                  batch_size=args.batch_size, precision=args.precision, lm_path=args.lm_path,
                                  lm_weight=args.lm_weight, lm_eos=args.lm_eos)
        start = time.perf_counter()
        texts = transcriber.transcribe(args.audio, timestamps=args.timestamps)
    except InputError as error:
        for problem in error.problems:
            logger.error(problem)
        logger.error(f"{len(error.problems)} of {len(args.audio)} audio files cannot be transcribed (listed above)")
        return 1
    except (FileNotFoundError, ValueError) as error:  # a missing data file, a foreign checkpoint, bad audio
        logger.error(str(error))
        return 1
    for path, text in zip(args.audio, texts):
        _print_line(path, text, args.timestamps)
    logger.info(f"transcribed {len(texts)} files in {time.perf_counter() - start:.1f} s")
    return 0


def _print_line(path: str, text: str | TimedTranscript, timestamps: bool) -> None:
    print(f"{path}\t{text.text}\t{timed_words_json(text.words)}" if timestamps else f"{path}\t{text}", flush=True)


def _stream_main(args: argparse.Namespace) -> int:
    """``--stream``: every file checked first, then streamed in ``--chunk-ms`` chunks, one after the other."""
    from .streaming.transcriber import StreamingTranscriber  # it builds on this module

    problems = []
    for path in args.audio:
        try:
            audio_frames(path)
        except AudioError as error:
            problems.append(str(error))
    for problem in problems:
        logger.error(problem)
    if problems:
        logger.error(f"{len(problems)} of {len(args.audio)} audio files cannot be transcribed (listed above)")
        return 1
    chunk_ms = args.chunk_ms or 320
    try:
        stream = StreamingTranscriber(args.checkpoint, timestamps=args.timestamps, data_dir=args.data_dir,
                                      device="cpu" if args.cpu else None, beam=args.beam, search=args.search,
                                      max_symbols_per_frame=args.max_symbols_per_frame, lenpen=args.lenpen,
                                      blank_penalty=args.blank_penalty, precision=args.precision,
                                      lm_path=args.lm_path, lm_weight=args.lm_weight, lm_eos=args.lm_eos)
        start = time.perf_counter()
        for path in args.audio:
            def show(seconds: float, text: str, path: str = path) -> None:
                print(f"{path} [{seconds:.2f} s] {text}", file=sys.stderr, flush=True)
            result = stream.stream_file(path, chunk_ms, show)
            _print_line(path, result if args.timestamps else result.text, args.timestamps)
    except (FileNotFoundError, ValueError) as error:  # a missing data file, a model or data that cannot stream
        logger.error(str(error))
        return 1
    logger.info(f"streamed {len(args.audio)} files in {chunk_ms:g} ms chunks in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
