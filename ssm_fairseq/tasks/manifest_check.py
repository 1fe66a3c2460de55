"""Checks of a speech-to-text manifest when its split is loaded, so that bad rows fail at once and by name.

fairseq's reader turns a row with a missing column into a row of ``None`` fields (a wrong reference, silently)
and finds a missing or malformed feature file only when a batch reaches it, mid-epoch. Here every row is
checked before training or decoding starts: all five columns present, ``n_frames`` a positive integer, and a
``.npy`` feature file that exists, is ``T x F`` with the config's ``F``, and has the ``n_frames`` the manifest
says (only the file's header is read, not its data). Errors name the manifest, its line and the utterance.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

COLUMNS = ("id", "audio", "n_frames", "tgt_text", "speaker")


def _npy_shape(path: Path) -> tuple[int, ...]:
    """The array shape in a ``.npy`` header, without reading the data."""
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, _ = read_header(f)
    return shape


def check_manifest(root: Path, split: str, feature_dim: int) -> int:
    """Check ``root/split.tsv``; return its number of utterances or raise ``ValueError`` naming the bad row."""
    manifest = Path(root) / f"{split}.tsv"
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: no such manifest (split {split!r})")
    with open(manifest, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t", quotechar=None, doublequote=False, lineterminator="\n",
                                quoting=csv.QUOTE_NONE)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{manifest}:1: header lacks column(s) {', '.join(missing)} "
                             f"(expected {' '.join(COLUMNS)})")
        count = 0
        for line, row in enumerate(reader, start=2):
            count += 1
            where = f"{manifest}:{line}: utterance {row.get('id')!r}"
            if None in row or any(row[c] is None for c in COLUMNS):
                raise ValueError(f"{where}: expected {len(reader.fieldnames)} tab-separated columns")
            if not row["n_frames"].isdigit() or int(row["n_frames"]) < 1:
                raise ValueError(f"{where}: n_frames must be a positive integer, got {row['n_frames']!r}")
            audio = row["audio"]
            if audio.endswith(".npy"):
                path = Path(audio) if Path(audio).is_absolute() else Path(root) / audio
                if not path.is_file():
                    raise ValueError(f"{where}: feature file {path} does not exist")
                try:
                    shape = _npy_shape(path)
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
