"""Checks of a speech-to-text manifest when its split is loaded, so that bad rows fail at once and by name.

fairseq's reader turns a row with a missing column into a row of ``None`` fields (a wrong reference, silently)
and finds a missing or malformed feature file only when a batch reaches it, mid-epoch. Here every row is
checked before training or decoding starts: all five columns present, ``n_frames`` a positive integer, and a
``.npy`` feature file that exists where fairseq will read it (``config.yaml``'s ``audio_root``, resolved against
the data directory by ``data_config``, joined with the row's path), is ``T x F`` with the config's ``F``, holds
all the data its header promises, and has the ``n_frames`` the manifest says (only the file's header and size are
read, not its data). Errors name the manifest, its line and the utterance.
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..asr.features.feature_files import npy_shape
from ..asr.preparation.manifests import MANIFEST_COLUMNS
from ..asr.transducer.data_config import DataDirectoryConfig


def feature_path(audio_root: str, audio: str) -> Path:
    """Where fairseq's ``speech_to_text`` dataset reads a manifest row's ``audio``: ``Path(audio_root) / audio``
    (an absolute ``audio`` stands alone; a relative result is relative to the working directory, not to the data
    directory)."""
    return Path(audio_root) / audio


def check_manifest(root: Path, split: str, feature_dim: int, audio_root: str | None = None) -> int:
    """Check ``root/split.tsv``; return its number of utterances or raise ``ValueError`` naming the bad row.

    ``audio_root``: the data config's (``DataDirectoryConfig.audio_root``); None reads it from ``root/config.yaml``
    (relative to ``root``, as the ``speech_transducer`` task does).
    """
    manifest = Path(root) / f"{split}.tsv"
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: no such manifest (split {split!r})")
    if audio_root is None:
        audio_root = DataDirectoryConfig(Path(root) / "config.yaml").audio_root
    with open(manifest, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t", quotechar=None, doublequote=False, lineterminator="\n",
                                quoting=csv.QUOTE_NONE)
        missing = [c for c in MANIFEST_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{manifest}:1: header lacks column(s) {', '.join(missing)} "
                             f"(expected {' '.join(MANIFEST_COLUMNS)})")
        count = 0
        for line, row in enumerate(reader, start=2):
            count += 1
            where = f"{manifest}:{line}: utterance {row.get('id')!r}"
            if None in row or any(row[c] is None for c in MANIFEST_COLUMNS):
                raise ValueError(f"{where}: expected {len(reader.fieldnames)} tab-separated columns")
            if not row["n_frames"].isdigit() or int(row["n_frames"]) < 1:
                raise ValueError(f"{where}: n_frames must be a positive integer, got {row['n_frames']!r}")
            audio = row["audio"]
            if audio.endswith(".npy"):
                path = feature_path(audio_root, audio)
                if not path.is_file():
                    raise ValueError(f"{where}: feature file {path} does not exist (config.yaml's audio_root "
                                     f"{audio_root!r} joined with the row's {audio!r})")
                try:
                    shape = npy_shape(path)
                except (OSError, ValueError) as error:
                    raise ValueError(f"{where}: {path} is not a readable .npy file ({error})") from None
                if len(shape) != 2 or shape[1] != feature_dim:
                    raise ValueError(f"{where}: {path} holds features of shape {shape}; config.yaml says "
                                     f"input_feat_per_channel: {feature_dim}")
                if shape[0] != int(row["n_frames"]):
                    raise ValueError(f"{where}: n_frames is {row['n_frames']} but {path} has {shape[0]} frames")
    if count == 0:
        raise ValueError(f"{manifest}: no utterances")
    return count
