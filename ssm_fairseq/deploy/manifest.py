"""The exported directory: which files it holds, the metadata every file carries, and the check at load time.

    DIR/encoder.onnx     the encoder's chunk step (states in and out), or    } fp32
                         its whole-utterance graph (``--offline``)          }
    DIR/predictor.onnx   the predictor's step (LSTM state in and out)        }
    DIR/joiner.onnx      the joiner                                          }
    DIR/*.int8.onnx      the same, dynamically quantized (``--int8`` only)
    DIR/manifest.json    the metadata below, and each file's size and SHA-256

The metadata (``manifest.json``'s ``metadata``, and the same JSON in every ONNX file's ``metadata_props`` under
``METADATA_KEY``) is all a runtime needs besides the graphs: which encoder (``"streaming"``: the chunk length and
sub-sampling stride, the state shapes; ``"offline"``: the piece length), the feature settings and their CMVN (global
statistics, or utterance CMVN's settings), the vocabulary (the dictionary's units in id order), the
blank and the units the search never emits, and an ``export_id`` shared by the files of one export, so that a file
from another export is refused even where its checksum was edited. Imports nothing outside the standard library.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import ExportDirectoryError

FORMAT = "ssm_fairseq-onnx-transducer"
FORMAT_VERSION = 3  # 2: the encoder kind (streaming or offline) and utterance CMVN in the metadata; 3: adaptive CMVN
MANIFEST = "manifest.json"
METADATA_KEY = "ssm_fairseq"
GRAPHS = ("encoder", "predictor", "joiner")
PRECISIONS = ("fp32", "int8")


def graph_file(graph: str, precision: str = "fp32") -> str:
    """``encoder.onnx``, ``encoder.int8.onnx``, ..."""
    return f"{graph}.onnx" if precision == "fp32" else f"{graph}.{precision}.onnx"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, metadata: dict, files: list[str]) -> None:
    """``manifest.json`` in ``directory``: the format, the metadata and each of ``files``' size and digest."""
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "metadata": metadata,
                "files": {name: {"bytes": (directory / name).stat().st_size, "sha256": sha256(directory / name)}
                          for name in files}}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def read_manifest(directory: Path | str, precision: str = "fp32") -> dict:
    """The metadata of an exported ``directory``, checked: the manifest is there and of this format, and the three
    graphs of ``precision`` are there with the manifest's sizes and digests. ``ExportDirectoryError`` names the first
    file that is missing or differs."""
    directory = Path(directory)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    path = directory / MANIFEST
    if not path.is_file():
        raise ExportDirectoryError(f"{path}: no manifest: {directory} is not a complete ssm-export-onnx directory")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportDirectoryError(f"{path}: unreadable manifest ({error})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ExportDirectoryError(f"{path}: not an ssm-export-onnx manifest (format {FORMAT!r} expected)")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ExportDirectoryError(f"{path}: format version {manifest.get('format_version')}; this runtime reads "
                                   f"version {FORMAT_VERSION}: export the checkpoint again")
    for graph in GRAPHS:
        name = graph_file(graph, precision)
        record = manifest["files"].get(name)
        if record is None:
            hint = " (export with --int8)" if precision == "int8" else ""
            raise ExportDirectoryError(f"{path}: lists no {name}{hint}")
        file = directory / name
        if not file.is_file():
            raise ExportDirectoryError(f"{file}: missing (the manifest lists it)")
        if file.stat().st_size != record["bytes"] or sha256(file) != record["sha256"]:
            raise ExportDirectoryError(f"{file}: not the file the manifest lists (size or SHA-256 differs): "
                                       "replaced or damaged after the export")
    return manifest["metadata"]


def check_file_metadata(path: Path | str, carried: dict[str, str], metadata: dict) -> None:
    """``ExportDirectoryError`` unless an ONNX file's ``metadata_props`` (``carried``) hold this export's metadata."""
    text = carried.get(METADATA_KEY)
    if text is None:
        raise ExportDirectoryError(f"{path}: carries no {METADATA_KEY} metadata: not written by ssm-export-onnx")
    if json.loads(text).get("export_id") != metadata["export_id"]:
        raise ExportDirectoryError(f"{path}: from another export than {MANIFEST} (export_id differs): do not mix "
                                   "the files of two exports")
