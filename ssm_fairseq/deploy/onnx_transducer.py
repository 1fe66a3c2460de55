"""An exported directory loaded into ONNX Runtime: the encoder run chunk by chunk over a stream, the predictor and the
joiner a step at a time, with numpy arrays in and out. Imports numpy and onnxruntime only (no torch, no fairseq).

    model = OnnxTransducer("exported/")            # fp32; OnnxTransducer("exported/", "int8") for the int8 copies
    encoder = model.encoder_stream()               # one per utterance
    frames = encoder.accept(features)              # n x 80 normalised features -> the encoder frames they complete
    frames = encoder.finish()                      # the stream's last, partial chunk
    frames = model.encode_utterance(features)      # an offline export (--offline): the whole utterance at once
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from .manifest import GRAPHS, check_file_metadata, graph_file, read_manifest


class OnnxTransducer:
    """The three graphs of an exported directory (``manifest``: each file checked against the manifest and carrying
    its export id, else ``ExportDirectoryError``) in ONNX Runtime sessions on the CPU.

    Args:
        directory: written by ``ssm-export-onnx``.
        precision: ``"fp32"``, or ``"int8"`` for the dynamically quantized copies (``--int8``).
        threads: intra-op threads of each session (default: ONNX Runtime's, one per core).
    """

    def __init__(self, directory: Path | str, precision: str = "fp32", threads: int | None = None):
        self.directory, self.precision = Path(directory), precision
        self.metadata = read_manifest(self.directory, precision)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.sessions: dict[str, ort.InferenceSession] = {}
        for graph in GRAPHS:
            path = self.directory / graph_file(graph, precision)
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            check_file_metadata(path, session.get_modelmeta().custom_metadata_map, self.metadata)
            self.sessions[graph] = session
        meta = self.metadata
        self.offline = meta["encoder"] == "offline"
        self.blank, self.frame_seconds = meta["blank"], meta["frame_seconds"]
        self.chunk_frames = meta.get("chunk_frames")
        self.state_names = meta.get("state_names", [])

    def initial_states(self) -> list[np.ndarray]:
        """The encoder's zero states, one ``1 x H x N`` array per SSM stage."""
        return [np.zeros(shape, dtype=np.float32) for shape in self.metadata["state_shapes"]]

    def encode_chunk(self, features: np.ndarray, states: list[np.ndarray]
                     ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """``n x F`` normalised features, ``0 < n <= chunk_frames`` (fewer only as a stream's last chunk), and the
        states -> ``encoder_out`` ``m x D``, ``encoder_proj`` ``m x J`` (the valid encoder frames) and the next states
        (not the stream's after a short chunk)."""
        n = features.shape[0]
        padded = np.zeros((1, self.chunk_frames, features.shape[1]), dtype=np.float32)
        padded[0, :n] = features
        feeds = {"features": padded, "valid_frames": np.array([n], dtype=np.int64),
                 **dict(zip(self.state_names, states))}
        encoder_out, encoder_proj, frames, *next_states = self.sessions["encoder"].run(None, feeds)
        m = int(frames[0])
        return encoder_out[0, :m], encoder_proj[0, :m], next_states

    def encode_utterance(self, features: np.ndarray) -> np.ndarray:
        """An offline export's whole-utterance encoder: ``T x F`` normalised features -> the ``T' x J`` projected
        encoder frames."""
        if not self.offline:
            raise ValueError(f"{self.directory} holds a streaming encoder: encode it chunk by chunk (encoder_stream)")
        feeds = {"features": np.ascontiguousarray(features, dtype=np.float32)[None]}
        return self.sessions["encoder"].run(["encoder_proj"], feeds)[0][0]

    def encoder_stream(self) -> EncoderStream:
        if self.offline:
            raise ValueError(f"{self.directory} holds an offline (whole-utterance) encoder, which cannot run chunk by "
                             "chunk: transcribe whole files (export a causal model for streaming)")
        return EncoderStream(self)

    def predictor_step(self, tokens: np.ndarray, h: np.ndarray, c: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``N`` labels and the ``layers x N x hidden`` LSTM state -> the joiner's ``N x J`` projection of the
        predictor output and the next state."""
        return tuple(self.sessions["predictor"].run(None, {"tokens": np.asarray(tokens, dtype=np.int64), "h": h,
                                                           "c": c}))

    def start_predictor(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The predictor after the start symbol (the blank) for ``rows`` rows: projection, ``h``, ``c``."""
        shape = (self.metadata["predictor_layers"], rows, self.metadata["predictor_hidden"])
        zeros = np.zeros(shape, dtype=np.float32)
        return self.predictor_step(np.full(rows, self.blank, dtype=np.int64), zeros, zeros)

    def joint_log_probs(self, encoder_rows: np.ndarray, predictor_rows: np.ndarray,
                        blank_penalty: float = 0.0) -> np.ndarray:
        """The joiner's ``N x V`` float32 log-probabilities for ``N`` (encoder, predictor) projection pairs, the
        blank's logit lowered by ``blank_penalty`` first (``asr.search.hypothesis.joint_log_probs``)."""
        logits, = self.sessions["joiner"].run(None, {"encoder_proj": np.ascontiguousarray(encoder_rows),
                                                     "predictor_proj": np.ascontiguousarray(predictor_rows)})
        if blank_penalty:
            logits[:, self.blank] -= np.float32(blank_penalty)
        shifted = logits - logits.max(axis=1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


class EncoderStream:
    """One utterance through the encoder: features are kept until a chunk is complete (``chunk_frames``), then
    encoded with the states carried from the chunk before; ``finish`` encodes the last, partial chunk. Over a stream
    the encoder frames are ``SpeechEncoder.forward``'s on all its features, whatever pieces they come in."""

    def __init__(self, model: OnnxTransducer):
        self.model = model
        self.states = model.initial_states()
        self.pending = np.zeros((0, model.metadata["features"]["num_mel_bins"]), dtype=np.float32)
        self.finished = False

    def accept(self, features: np.ndarray) -> np.ndarray:
        """``n x F`` normalised features (``n >= 0``) -> the ``m x J`` projected encoder frames they complete."""
        if self.finished:
            raise ValueError("the encoder stream has finished: start a new one")
        features = np.concatenate([self.pending, np.asarray(features, dtype=np.float32)])
        chunk = self.model.chunk_frames
        complete = features.shape[0] // chunk * chunk
        outputs = []
        for start in range(0, complete, chunk):
            _, proj, self.states = self.model.encode_chunk(features[start:start + chunk], self.states)
            outputs.append(proj)
        self.pending = features[complete:]
        return self._joined(outputs)

    def finish(self) -> np.ndarray:
        """The stream ends: the projected encoder frames of its last, partial chunk (none if it has no frame)."""
        if self.finished:
            raise ValueError("the encoder stream has finished already")
        self.finished = True
        if not self.pending.shape[0]:
            return self._joined([])
        _, proj, _ = self.model.encode_chunk(self.pending, self.states)
        return proj

    def _joined(self, outputs: list[np.ndarray]) -> np.ndarray:
        if outputs:
            return np.concatenate(outputs)
        return np.zeros((0, self.model.metadata["joint_dim"]), dtype=np.float32)
