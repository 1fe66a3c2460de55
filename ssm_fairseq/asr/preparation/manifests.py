"""fairseq's speech-to-text manifests (``id audio n_frames tgt_text speaker``): written atomically, and the ids of
those already in a data directory."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from ssm_fairseq.atomic_files import replacing

if TYPE_CHECKING:  # an annotation only: corpus.py imports this module
    from .corpus import Utterance

MANIFEST_COLUMNS = ["id", "audio", "n_frames", "tgt_text", "speaker"]


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed into place (``atomic_files.replacing``): a run
    that fails midway leaves the file as it was."""
    with replacing(path) as temporary:
        temporary.write_bytes(data)


def write_manifest(path: Path, utterances: list[Utterance], frames: dict[str, int], out: Path) -> None:
    """fairseq's manifest, written atomically (a temporary file renamed into place).

    fairseq reads it with ``csv.QUOTE_NONE`` and no quote character: fields are written verbatim, so quotes and
    any UTF-8 text round-trip (transcripts were read with their whitespace normalised to single spaces).
    """
    rows = ["\t".join(MANIFEST_COLUMNS)]
    for u in utterances:
        rows.append("\t".join([u.id, u.features.relative_to(out).as_posix(), str(frames[u.id]), u.text, u.speaker]))
    replace_file(path, "".join(row + "\n" for row in rows).encode("utf-8"))


def prepared_ids(out: Path) -> dict[str, list[tuple[Path, str]]]:
    """Utterance id -> ``(manifest, features path)`` for every row of the manifests already in ``out`` (its ``*.tsv``
    files with a manifest header: not the ``.rejected.tsv`` lists)."""
    where: dict[str, list[tuple[Path, str]]] = {}
    for manifest in sorted(out.glob("*.tsv")):
        with open(manifest, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            if reader.fieldnames != MANIFEST_COLUMNS:
                continue
            for row in reader:
                where.setdefault(row["id"], []).append((manifest, row["audio"]))
    return where


def write_combined_manifest(out: Path, name: str, train_subsets: list[str]) -> None:
    """``out/NAME.tsv``: the rows of every training subset's manifest under one header (``--combine-train``)."""
    manifests = [(out / f"{subset}.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
                 for subset in train_subsets]
    rows = [row for manifest in manifests for row in manifest[1:]]
    replace_file(out / f"{name}.tsv", "".join(manifests[0][:1] + rows).encode("utf-8"))

