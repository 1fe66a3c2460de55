"""The errors of ONNX export and of the ONNX Runtime recognizer, each naming what is wrong (imports nothing)."""
from __future__ import annotations


class DeployError(ValueError):
    """Base class: a model, a setting or an exported directory that cannot be exported or run."""


class NotStreamableError(DeployError):
    """A checkpoint whose encoder (or feature transforms) needs the whole utterance: it has no chunk step to export
    (a bidirectional encoder, attention layers, the conv sub-sampler, sinusoidal positions, utterance CMVN)."""


class UnsupportedModelError(DeployError):
    """A checkpoint of a task, architecture or data configuration the exporter does not handle."""


class ExportDirectoryError(DeployError):
    """An exported directory that is incomplete or inconsistent: a missing file, a file whose checksum or export id
    is not the manifest's, or a manifest of another format version."""
