"""Dictionary files recorded by what they mean, so that a vocabulary prepared again compares equal to the first.

A SentencePiece ``.model`` file is a ``ModelProto`` that also records how it was trained: its ``TrainerSpec`` holds
the input files and the output prefix (``ssm-prepare-librispeech`` trains in a temporary directory, so every
preparation writes other bytes), the thread count and the sampling options. Two models trained on the same text
with the same options into two directories differ in those bytes only. ``sentencepiece_content_sha256`` hashes
what encoding and decoding read instead, byte for byte as the file stores it:

* every piece (its string, score and type: normal, unknown, control, user-defined, byte, unused), in id order;
* the normalizer and denormalizer specs (rule name, precompiled character map, dummy prefix and whitespace
  options), without ``normalization_rule_tsv``, the path of the rules' source file (they are compiled into the
  character map);
* of the trainer spec, the fields the processor reads when it encodes or decodes: the model type, whitespace as
  suffix, whitespace-only pieces, byte fallback, the special pieces' ids and strings, and the surface of
  ``<unk>``.

Fingerprints are records ``{"file": absolute path, "sha256": digest of the bytes}``; a SentencePiece model's adds
``"content_sha256"`` and ``"content_version"`` (``CONTENT_VERSION``: the definition above). Two records compare by
content where both have a content digest of the same version, else by bytes: records saved before content digests
(``sha256`` only) still match the very same file.

Only the protobuf wire format is read (no protobuf package needed): a field is a varint key (number, wire type)
followed by a varint, 8 bytes, 4 bytes or a length-prefixed string.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterator, Mapping

CONTENT_VERSION = 1
SENTENCEPIECE_ROLE = "sentencepiece_model"  # the fingerprint role of config.yaml's bpe_tokenizer.sentencepiece_model

# ModelProto field numbers (sentencepiece_model.proto): what is kept of each message, by field number
PIECES, TRAINER_SPEC, NORMALIZER_SPEC, DENORMALIZER_SPEC = 1, 2, 3, 5
NORMALIZER_RULE_TSV = 6  # a path, read only at training
TRAINER_FIELDS_READ_AT_RUNTIME = frozenset({
    3,  # model_type
    24,  # treat_whitespace_as_suffix
    26,  # allow_whitespace_only_pieces
    35,  # byte_fallback
    40, 41, 42, 43,  # unk_id, bos_id, eos_id, pad_id
    44,  # unk_surface
    45, 46, 47, 48,  # unk_piece, bos_piece, eos_piece, pad_piece
})
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint starting at ``data[at]`` -> (value, the offset after it)."""
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("a varint runs past the end")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """The fields of one protobuf message, in stored order -> (number, the field's bytes, its payload: a string's
    or sub-message's bytes, else the value's)."""
    at = 0
    while at < len(data):
        start = at
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            end = _varint(data, at)[1]
        elif wire_type in (_FIXED64, _FIXED32):
            end = at + (8 if wire_type == _FIXED64 else 4)
        elif wire_type == _LENGTH:
            length, at = _varint(data, at)
            end = at + length
        else:
            raise ValueError(f"wire type {wire_type} of field {number} is not one a SentencePiece model uses")
        if end > len(data) or number == 0:
            raise ValueError(f"field {number} runs past the end")
        yield number, data[start:end], data[at:end]
        at = end


def _kept(data: bytes, keep) -> bytes:
    """The fields of message ``data`` whose number ``keep(number)`` accepts, as stored."""
    return b"".join(field for number, field, _ in _fields(data) if keep(number))


def sentencepiece_content(data: bytes) -> bytes:
    """What of a serialized SentencePiece ``ModelProto`` encoding and decoding read (see the module doc), as one
    string of tagged parts; ``ValueError`` if ``data`` is no such message (or holds no piece)."""
    parts = []
    for number, _, payload in _fields(data):
        if number == PIECES:
            parts.append(b"P" + payload)
        elif number in (NORMALIZER_SPEC, DENORMALIZER_SPEC):
            parts.append(b"N%d" % number + _kept(payload, lambda n: n != NORMALIZER_RULE_TSV))
        elif number == TRAINER_SPEC:
            parts.append(b"T" + _kept(payload, TRAINER_FIELDS_READ_AT_RUNTIME.__contains__))
    if not any(part.startswith(b"P") for part in parts):
        raise ValueError("no pieces")
    return b"".join(len(part).to_bytes(8, "big") + part for part in parts)


def sentencepiece_content_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of ``sentencepiece_content`` of the model file at ``path``; ``ValueError`` naming the file if it
    is not a SentencePiece model."""
    try:
        return hashlib.sha256(sentencepiece_content(Path(path).read_bytes())).hexdigest()
    except ValueError as error:
        raise ValueError(f"{path} is not a SentencePiece model ({error})") from None


def file_record(path: Path, role: str) -> dict:
    """``{"file": absolute path, "sha256": digest of the bytes}`` of the existing file ``path``; for the role
    ``sentencepiece_model`` also its ``content_sha256`` and ``content_version``."""
    record = {"file": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    if role == SENTENCEPIECE_ROLE:
        record.update(content_sha256=sentencepiece_content_sha256(path), content_version=CONTENT_VERSION)
    return record


def compared_digest(first: Mapping, second: Mapping) -> str:
    """The key two file records compare by: ``content_sha256`` where both have one of the same version, else
    ``sha256`` (the bytes)."""
    if first.get("content_sha256") and first.get("content_version") == second.get("content_version") and \
            second.get("content_sha256"):
        return "content_sha256"
    return "sha256"


def same_file(first: Mapping, second: Mapping) -> bool:
    """Whether two file records hold the same dictionary file (``compared_digest``)."""
    key = compared_digest(first, second)
    return first[key] == second[key]


def shown(record: Mapping, key: str) -> str:
    """``FILE (sha256 ab12cd34ef56)``, or ``(content sha256 ...)`` for a content digest."""
    return f"{record['file']} ({'content ' if key == 'content_sha256' else ''}sha256 {record[key][:12]})"


def same_sentencepiece_model(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Whether two SentencePiece model files encode and decode alike (the same ``sentencepiece_content``); an
    unreadable or malformed file is no match."""
    try:
        return sentencepiece_content_sha256(first) == sentencepiece_content_sha256(second)
    except (OSError, ValueError):
        return False
