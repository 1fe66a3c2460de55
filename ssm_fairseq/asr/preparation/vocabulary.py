"""The SentencePiece model and fairseq dictionary of a data directory: trained on its training transcripts, installed
so that a re-run with the same inputs changes nothing and one that would change them is refused."""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import sentencepiece as spm
import yaml

from ssm_fairseq.integrity.vocabulary_fingerprint import same_sentencepiece_model
from ssm_fairseq.text_files import train_sentencepiece_model
from .features import ExtractedSubset
from .manifests import replace_file

logger = logging.getLogger("prepare_librispeech")  # the log lines of every step of a preparation

LM_DICTIONARY = "dict.txt"  # the dictionary again, where fairseq's language_modeling task (and LM fusion) reads it

MIN_VOCAB_SIZE = 5  # SentencePiece's <s>, <pad>, </s>, <unk> and one piece


class VocabularyError(Exception):
    """This run's SentencePiece model or dictionary would replace a different one already in ``--out``."""


def train_sentencepiece(texts: list[str], prefix: Path, vocab_size: int) -> None:
    """Unigram SentencePiece on ``texts``: writes ``PREFIX.model`` and its fairseq dictionary ``PREFIX.txt``.

    ``ValueError`` naming --vocab-size and the minimum if ``vocab_size`` is below the transcripts' characters.
    """
    text_file = prefix.with_name(f"{prefix.name}.input.txt")
    text_file.write_text("\n".join(texts) + "\n", encoding="utf-8")
    train_sentencepiece_model(
        input=str(text_file), model_prefix=str(prefix), model_type="unigram", vocab_size=vocab_size,
        character_coverage=1.0, bos_id=0, pad_id=1, eos_id=2, unk_id=3, hard_vocab_limit=False,
        input_sentence_size=1_000_000, shuffle_input_sentence=True, num_threads=1, minloglevel=2,
    )
    text_file.unlink()
    model = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    pieces = [model.id_to_piece(i) for i in range(4, model.get_piece_size())]  # fairseq adds the 4 specials
    Path(f"{prefix}.txt").write_text("".join(f"{piece} 1\n" for piece in pieces), encoding="utf-8")
    logger.info(f"SentencePiece unigram: {model.get_piece_size()} units (asked for {vocab_size})")


def _same_vocabulary_file(new: Path, old: Path) -> bool:
    """Whether ``old`` holds the vocabulary ``new`` holds: the same dictionary text, or a SentencePiece model that
    encodes and decodes alike (``vocabulary_fingerprint``: a model also records where it was trained, which may
    differ)."""
    if new.suffix == ".model":
        return same_sentencepiece_model(new, old)
    return new.read_bytes() == old.read_bytes()


def install_vocabulary(trained: Path, out: Path, overwrite: bool) -> str:
    """Move the model and dictionary trained at prefix ``trained`` into ``out`` -> their name (``spm_unigram{V}``).

    Files already there with the same vocabulary are left untouched (byte for byte); if one differs, or the
    existing ``config.yaml`` names another vocabulary, ``VocabularyError`` (unless ``overwrite``): models trained
    on ``out`` use the existing one.
    """
    name = trained.name
    pairs = [(Path(f"{trained}{ext}"), out / f"{name}{ext}") for ext in (".model", ".txt")]
    conflicts = [old for new, old in pairs if old.exists() and not _same_vocabulary_file(new, old)]
    config = out / "config.yaml"
    if config.is_file():
        configured = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        dictionary = configured.get("vocab_filename")
        if dictionary not in (None, f"{name}.txt"):
            model = (configured.get("bpe_tokenizer") or {}).get("sentencepiece_model")
            conflicts += [out / dictionary] + ([out / model] if model else [])
    if conflicts and not overwrite:
        raise VocabularyError(
            f"this run's SentencePiece model and dictionary ({name}) differ from "
            f"{', '.join(map(str, conflicts))} (other --train-subsets, transcripts or --vocab-size?), which models "
            f"trained on {out} use: prepare into a new --out, or pass --overwrite-vocabulary to replace them")
    for new, old in pairs:
        if old in conflicts or not old.exists():
            new.replace(old)
    if conflicts:
        logger.warning(f"--overwrite-vocabulary: replaced {', '.join(map(str, conflicts))} with {out / name}")
    lm_dictionary, dictionary = out / LM_DICTIONARY, (out / f"{name}.txt").read_bytes()
    if not lm_dictionary.is_file() or lm_dictionary.read_bytes() != dictionary:
        replace_file(lm_dictionary, dictionary)
    return name


def prepared_vocabulary(out: Path, subsets: list[str]) -> str:
    """The vocabulary (``spm_unigram{V}``) of the data directory ``out`` that evaluation ``subsets`` are added to:
    a run without training subsets keeps ``out``'s SentencePiece model, dictionary and ``config.yaml``. Raises
    ``ValueError`` when ``out`` has no prepared vocabulary to add them to."""
    path = out / "config.yaml"
    config = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}
    vocabulary = config.get("vocab_filename")
    model = (config.get("bpe_tokenizer") or {}).get("sentencepiece_model")
    missing = [name for name in (vocabulary, model) if name and not (out / name).is_file()]
    if not vocabulary or not model or missing:
        raise ValueError(f"none of {subsets} is a training subset (--train-subsets, or by default the subsets whose "
                         f"name starts with 'train') and {out} has no prepared vocabulary to add them to "
                         f"({path}{': missing ' + ', '.join(missing) if missing else ' names none'}): prepare the "
                         f"training subsets first, or with them")
    return Path(vocabulary).stem


def train_vocabulary(out: Path, train_subsets: list[str], extracted: dict[str, ExtractedSubset], vocab_size: int,
                     overwrite: bool) -> str:
    """SentencePiece and its dictionary trained on the transcripts of the training subsets' kept utterances, installed
    in ``out`` (``install_vocabulary``) -> their name. ``ValueError`` when every utterance was left out."""
    texts = [u.text for subset in train_subsets for u in extracted[subset].utterances]
    if not texts:
        raise ValueError(f"no training transcripts in {train_subsets} to train SentencePiece on (every utterance was "
                         f"left out: see their .rejected.tsv)")
    with tempfile.TemporaryDirectory(prefix=".spm-", dir=out) as scratch:
        trained = Path(scratch) / f"spm_unigram{vocab_size}"
        train_sentencepiece(texts, trained, vocab_size)
        return install_vocabulary(trained, out, overwrite)

