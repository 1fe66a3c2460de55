"""Speech recognition on ONNX Runtime from an exported directory, without torch or fairseq: files and live streams.

    from ssm_fairseq.deploy.recognizer import OnnxRecognizer
    recognizer = OnnxRecognizer("exported/", beam=4)          # or precision="int8"
    texts = recognizer.transcribe(["a.flac", "b.wav"])        # list[str]; timestamps=True: TimedTranscripts
    stream = recognizer.stream()
    for samples in chunks:                                    # 16 kHz mono float32 in [-1, 1], any chunk size
        print(stream.accept_waveform(samples))                # the partial transcript
    text, words = stream.finish()

What ``asr.Recognizer`` does with the checkpoint, done with the exported graphs and numpy: the filterbanks
(``deploy.filterbank``), the global-CMVN statistics of the export (or utterance CMVN), the encoder chunk by chunk
(``onnx_transducer``; a whole file is one stream) or, for an offline export, on the whole file at once, the searches
(``deploy.search``), the units joined into words as ``fairseq-generate --post-process sentencepiece`` joins them (a
stream's partial transcript detokenizing only the units after those the last chunk's shares, ``asr.incremental_text``),
and word times from the alignment, emission and blank frames (``asr.search.word_timestamps``). For a streaming export a
file is a stream fed all at once, so offline and streamed transcripts are the same. Audio files must be 16 kHz
(channels are averaged): resampling is torchaudio's, which this runtime does not have; other rates are refused,
named. Imports numpy, onnxruntime and soundfile.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..asr.features.running_cmvn import RunningCMVN
from ..asr.incremental_text import IncrementalText, unit_piece
from ..asr.transcripts import InputError, TimedTranscript
from .filterbank import SAMPLE_RATE, StreamingFilterbank, frame_count, log_mel_filterbank
from .onnx_transducer import OnnxTransducer
from .search import MAX_SYMBOLS_PER_FRAME, Hypothesis, build_search


class OnnxRecognizer:
    """An exported directory in ONNX Runtime, with the search settings of ``ssm-transcribe`` (``beam`` 1: greedy;
    ``search``, ``max_symbols_per_frame``, ``lenpen``, ``blank_penalty`` as its flags). ``precision``: ``"fp32"`` or
    ``"int8"``; ``threads``: ONNX Runtime's intra-op threads."""

    def __init__(self, directory: Path | str, precision: str = "fp32", beam: int = 4, search: str = "exact",
                 max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME, lenpen: float = 1.0,
                 blank_penalty: float = 0.0, threads: int | None = None):
        for name, value in (("beam", beam), ("max_symbols_per_frame", max_symbols_per_frame)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.model = OnnxTransducer(directory, precision, threads)
        meta = self.model.metadata
        self.vocabulary: list[str] = meta["vocabulary"]
        self.strip = set(meta["strip"])
        self.unk, self.unk_word = meta["unk"], meta["unk_word"]
        # each unit's piece of text (IncrementalText's): "" for a stripped unit, the unknown word for <unk>
        self.pieces = ["" if index in self.strip else unit_piece(self.unk_word if index == self.unk else unit)
                       for index, unit in enumerate(self.vocabulary)]
        self.frame_seconds = meta["frame_seconds"]
        cmvn = meta["global_cmvn"]
        self.cmvn = None if cmvn is None else (np.array(cmvn["mean"]), np.array(cmvn["std"]))
        self.utterance_cmvn = meta["utterance_cmvn"]
        adaptive = meta["adaptive_cmvn"]  # after global CMVN: the prior's weight in frames
        self.adaptive_prior = None if adaptive is None else adaptive["prior_frames"]
        self.search_args = dict(beam=beam, search=search, max_symbols_per_frame=max_symbols_per_frame,
                                suppress=meta["suppress"], blank_penalty=blank_penalty)
        build_search(self.model, **self.search_args)  # the arguments checked now, not at the first file
        self.length_norm = lenpen

    def normalised(self, fbank: np.ndarray, adaptive: RunningCMVN | None = None) -> np.ndarray:
        """``T x 80`` filterbanks (the whole utterance's for utterance CMVN) -> the features the model saw in training
        (global CMVN, in float64 as fairseq's ``GlobalCMVN``, then float32, then, if the export has it, adaptive CMVN
        through ``adaptive``: the utterance's or stream's running statistics (``adaptive_cmvn``); or fairseq's
        ``UtteranceCMVN``); ``ValueError`` unless all are finite (the running statistics unchanged then)."""
        features = fbank if self.cmvn is None or not len(fbank) else (fbank - self.cmvn[0]) / self.cmvn[1]
        if self.utterance_cmvn is not None and len(fbank):
            features = utterance_cmvn(fbank, **self.utterance_cmvn)
        if not np.isfinite(features).all():
            raise ValueError("features are not finite (NaN or inf in the audio)")
        if adaptive is not None:
            return adaptive(features.astype(np.float32))
        return features.astype(np.float32)

    def adaptive_cmvn(self) -> RunningCMVN | None:
        """A new utterance's or stream's adaptive CMVN state, None if the export has no adaptive CMVN."""
        return None if self.adaptive_prior is None else RunningCMVN(self.adaptive_prior)

    def text(self, tokens: Sequence[int]) -> str:
        """Label ids -> words (``Dictionary.string(tokens, "sentencepiece")`` with the search's stripped symbols)."""
        return "".join(self.pieces[t] for t in tokens).strip()

    def timed_words(self, hypothesis: Hypothesis, duration: float | None) -> list:
        """The words of ``hypothesis`` with their times (``asr.search.word_timestamps``)."""
        from ..asr.search.word_timestamps import word_timestamps

        kept = [(t, f) for t, f in zip(hypothesis.tokens, hypothesis.frames) if t not in self.strip]
        return word_timestamps([self.vocabulary[t] for t, _ in kept], [f for _, f in kept], self.frame_seconds,
                               duration)

    def stream(self, timestamps: bool = False) -> OnnxStream:
        """A stream of one utterance after another; ``ValueError`` for an offline export."""
        if self.model.offline:
            raise ValueError(f"{self.model.directory} holds an offline (whole-utterance) encoder, which cannot "
                             "stream: transcribe whole files, or export a causal model for streaming")
        return OnnxStream(self, timestamps)

    def final_transcript(self, search, samples: int, timestamps: bool) -> TimedTranscript:
        """The best hypothesis of a finished ``search`` over ``samples`` samples as a transcript (its words timed
        with ``timestamps``); ``ValueError`` for a score that is not finite."""
        best = search.finish(1, self.length_norm)[0]
        if not np.isfinite(best.score):
            raise ValueError("the hypothesis score is not finite (NaN or inf)")
        words = self.timed_words(best, samples / SAMPLE_RATE) if timestamps else []
        return TimedTranscript(self.text(best.tokens), words)

    def _whole_utterance(self, samples: np.ndarray, timestamps: bool) -> TimedTranscript:
        """One file's samples through an offline export: features, CMVN, the encoder on all of them, the search."""
        search = build_search(self.model, **self.search_args)
        search.advance(self.model.encode_utterance(self.normalised(log_mel_filterbank(samples), self.adaptive_cmvn())))
        return self.final_transcript(search, len(samples), timestamps)

    def transcribe(self, paths: Sequence[Path | str], timestamps: bool = False) -> list[str] | list[TimedTranscript]:
        """The transcript of each audio file, in order (``TimedTranscript`` with ``timestamps``). Every file is read
        first: ``InputError`` names each one missing, unreadable, empty, not 16 kHz or not finite."""
        if isinstance(paths, (str, Path)):
            raise TypeError(f"transcribe takes a list of paths, got the single path {paths!r}")
        audio, problems = [], []
        for path in paths:
            try:
                audio.append(read_16k_mono(path))
            except ValueError as error:
                problems.append(f"{path}: {error}")
        if problems:
            raise InputError(problems)
        results = []
        for path, samples in zip(paths, audio):
            try:
                if self.model.offline:
                    result = self._whole_utterance(samples, timestamps)
                else:
                    stream = self.stream(timestamps)
                    stream.accept_features(log_mel_filterbank(samples), len(samples))
                    result = stream.finish()
            except ValueError as error:
                raise InputError([f"{path}: {error}"]) from error
            results.append(result if timestamps else result.text)
        return results


class OnnxStream:
    """One utterance at a time through an ``OnnxRecognizer``: ``accept_waveform`` chunk by chunk (partial transcript
    out), ``finish`` (final ``TimedTranscript``; the next sample starts a new utterance)."""

    def __init__(self, recognizer: OnnxRecognizer, timestamps: bool = False):
        self.recognizer, self.timestamps = recognizer, timestamps
        self._new_utterance()

    def _new_utterance(self) -> None:
        self.filterbank = StreamingFilterbank()
        self.encoder = self.recognizer.model.encoder_stream()
        self.search = build_search(self.recognizer.model, **self.recognizer.search_args)
        self.partial_text = IncrementalText(self.recognizer.pieces)  # detokenizes only what changed since a chunk
        self.cmvn = self.recognizer.adaptive_cmvn()  # the utterance's running statistics, if adaptive
        self.samples = 0

    def accept_features(self, fbank: np.ndarray, samples: int) -> None:
        """``T x 80`` filterbank frames of ``samples`` more samples -> into the encoder and the search."""
        proj = self.encoder.accept(self.recognizer.normalised(fbank, self.cmvn))
        self.samples += samples
        if proj.shape[0]:
            self.search.advance(proj)

    def accept_waveform(self, samples: np.ndarray) -> str:
        """The next 1-D float samples (16 kHz mono, in [-1, 1]) -> the partial transcript."""
        self.accept_features(self.filterbank.accept_waveform(samples), len(samples))
        return self.partial_text.text(self.search.partial(self.recognizer.length_norm).tokens)

    def finish(self) -> TimedTranscript:
        """End the utterance: its final transcript (words timed with ``timestamps``)."""
        try:
            proj = self.encoder.finish()
            if proj.shape[0]:
                self.search.advance(proj)
            return self.recognizer.final_transcript(self.search, self.samples, self.timestamps)
        finally:
            self._new_utterance()

    def stream_file(self, path: Path | str, chunk_ms: float,
                    on_partial: Callable[[float, str], None] | None = None) -> TimedTranscript:
        """An audio file as a stream of ``chunk_ms`` chunks; ``on_partial(seconds, text)`` whenever the partial
        transcript changes."""
        if not (isinstance(chunk_ms, (int, float)) and np.isfinite(chunk_ms) and chunk_ms > 0):
            raise ValueError(f"chunk_ms must be a positive, finite number of milliseconds, got {chunk_ms!r}")
        step = max(1, round(chunk_ms * SAMPLE_RATE / 1000))
        samples, shown = read_16k_mono(path), ""
        for start in range(0, len(samples), step):
            partial = self.accept_waveform(samples[start:start + step])
            if partial != shown and on_partial is not None:
                on_partial(self.samples / SAMPLE_RATE, partial)
            shown = partial
        return self.finish()


def utterance_cmvn(fbank: np.ndarray, norm_means: bool = True, norm_vars: bool = True) -> np.ndarray:
    """fairseq's ``UtteranceCMVN`` on ``T x F`` features: each bin's mean removed and its standard deviation (floored
    at ``1e-5``) divided out, both over the utterance."""
    mean = fbank.mean(axis=0)
    square_sums = (fbank ** 2).sum(axis=0)
    x = np.subtract(fbank, mean) if norm_means else fbank
    if norm_vars:
        x = np.divide(x, np.sqrt(np.maximum(square_sums / fbank.shape[0] - mean ** 2, 1e-10)))
    return x


def read_16k_mono(path: Path | str) -> np.ndarray:
    """An audio file's float32 samples, channels averaged; ``ValueError`` saying why for a file that is missing,
    unreadable, not 16 kHz, shorter than one 25 ms window or not finite."""
    import soundfile as sf

    if not Path(path).is_file():
        raise ValueError("audio file not found")
    try:
        waveform, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as error:  # soundfile raises several types for corrupt or foreign files
        raise ValueError(f"unreadable audio ({error})") from error
    if rate != SAMPLE_RATE:
        raise ValueError(f"{rate} Hz audio: the ONNX runtime reads 16 kHz only (resample it, e.g. sox in.wav -r 16000 "
                         "out.wav, or transcribe with the checkpoint, which resamples)")
    samples = waveform.mean(axis=1)
    if frame_count(len(samples)) == 0:
        raise ValueError(f"empty audio ({len(samples)} samples at {rate} Hz)")
    if not np.isfinite(samples).all():
        raise ValueError("samples are not finite (NaN or inf in the audio)")
    return samples

