"""LibriSpeech (or any corpus in its layout) -> fairseq speech-to-text data for ``--task speech_transducer``.

Input: ``ROOT/SUBSET/SPK/CHAPTER/SPK-CHAPTER-UTT.flac`` and one ``SPK-CHAPTER.trans.txt`` per chapter.
Output in ``--out``:

- ``fbank80/SUBSET/UTT.npy``: 80-dim log-Mel filterbanks, 25 ms window, 10 ms shift (``T x 80`` float32),
  computed with torchaudio's Kaldi-compatible ``fbank`` on 16-bit-scaled audio, as fairseq's own recipe does
  (``ssm_fairseq.asr.features.audio_features``, which ``python -m ssm_fairseq.transcribe`` shares), and beside it
  ``UTT.source``, the stamp of the FLAC it was computed from (path in the corpus, size, modification time);
- ``SUBSET.tsv``: fairseq's manifest (``id audio n_frames tgt_text speaker``), transcripts lower-cased;
  with ``--combine-train NAME`` also ``NAME.tsv``, every training subset in one manifest (``train-960``);
- ``spm_unigram{V}.model`` / ``.txt``: a SentencePiece unigram model trained on the training transcripts and
  its fairseq dictionary (ids agree: 0 ``<s>``, the transducer's blank, 1 ``<pad>``, 2 ``</s>``, 3 ``<unk>``);
- ``dict.txt``: the same dictionary under the name fairseq's ``language_modeling`` task reads: a language model
  trained over it (``fairseq-preprocess --srcdict dict.txt``) can be fused into the transducer's search
  (``fairseq-generate --lm-path``, which loads the LM with this directory's ``dict.txt``);
- ``config.yaml``: paths relative to ``--out`` (``audio_root: .``; the ``speech_transducer`` task reads them
  relative to the data directory, ``ssm_fairseq.asr.transducer.data_config``, so the directory can be moved or copied
  whole);
  CMVN on every subset, SpecAugment (LibriSpeech "LD" policy) on training subsets unless
  ``--no-specaugment``. ``--cmvn utterance`` (the default): fairseq's ``utterance_cmvn``, each utterance
  normalised by its own mean and std, which needs the whole utterance. ``--cmvn global``: fairseq's
  ``global_cmvn`` with ``gcmvn.npz`` (``mean``, ``std``: ``80`` float32 each), the mean and std of each bin over
  every frame of the training subsets (sums in float64, std floored at ``sqrt(1e-8)`` as fairseq's
  ``cal_gcmvn_stats`` does), named as ``gcmvn.npz``, relative to the directory: what a streaming model needs, as
  it normalises each frame as it comes (``ssm_fairseq.asr.features.filterbank``). ``--cmvn adaptive``: global CMVN
  followed by this package's ``adaptive_cmvn`` (``ssm_fairseq.asr.features.adaptive_cmvn``: each frame also
  normalised by the running statistics of its utterance so far, pooled with ``--cmvn-prior-frames`` frames of the
  training set's), in training and evaluation alike; causal, so a streaming model can use it too.

Audio at another sample rate is resampled to 16 kHz and several channels are averaged, with a log line per
kind of conversion, so the filterbanks match LibriSpeech's. Features are computed on ``--jobs`` processes
with progress logs; an utterance whose complete ``.npy`` is there with the stamp of its FLAC as it is now is
skipped, so an interrupted run resumes, and a replaced FLAC (or a feature file cut short) is featurised again.
Every problem (missing or unreadable audio, empty audio or transcript, audio without a transcript line, a
transcript line that is not UTF-8, an utterance id used twice in a subset, an id in two subsets prepared together
or in a manifest already in ``--out`` under other features: training data in an evaluation set) is reported by
file and utterance; the run then fails, unless ``--skip-bad`` is given, in which case the bad utterances are left
out and listed in ``SUBSET.rejected.tsv``.

Re-running into the same ``--out`` with the same inputs leaves the SentencePiece model and dictionary as they are
(byte for byte; models are compared by content, ``ssm_fairseq.integrity.vocabulary_fingerprint``). A run whose model or
dictionary would differ from the ones already there (other training subsets or transcripts, or another
``--vocab-size`` than ``config.yaml`` names), which models trained on this directory use, is refused before any
manifest is written, unless ``--overwrite-vocabulary`` is given. In the same way a run whose ``--cmvn`` differs
from the one the existing ``config.yaml`` uses is refused before any feature is computed, unless
``--overwrite-cmvn`` is given; with ``--cmvn global``, statistics that differ from the ``gcmvn.npz`` already there
(other training audio) replace it with a warning, as a changed ``config.yaml`` does (a ``config.yaml`` of an
earlier release, with absolute paths to the same files, is no change).

A run whose subsets include no training subset adds them to a prepared ``--out``: their features and manifests
are written with the vocabulary and ``config.yaml`` already there, which stay as they are (``--vocab-size`` and
the SpecAugment options are then unused; ``--cmvn`` must be the directory's), so models trained on ``--out``
decode them: ``--subsets test-other`` after a preparation of ``train-clean-100,dev-clean,test-clean``. Their ids
are checked against the manifests already there, as subsets prepared together are checked against each other.

Outputs that replace earlier ones (manifests, ``dict.txt``, ``config.yaml``, ``gcmvn.npz``, features) are written
to a temporary file renamed into place, so a run that fails leaves the earlier file whole.

    ssm-prepare-librispeech --librispeech-root LibriSpeech --out data --vocab-size 4096

(``python scripts/prepare_librispeech.py`` in the repository runs the same ``main``.)
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import logging
import multiprocessing
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import yaml

from ssm_fairseq.atomic_files import replacing
from ssm_fairseq.asr.features.adaptive_cmvn import ADAPTIVE_CMVN, check_prior_frames
from ssm_fairseq.asr.features.audio_features import NUM_MEL_BINS, AudioError, filterbank_features
from ssm_fairseq.asr.transducer.data_config import GLOBAL_CMVN_STATS
from ssm_fairseq.integrity.manifest_check import npy_shape
from ssm_fairseq.text_files import file_lines, train_sentencepiece_model, utf8
from ssm_fairseq.integrity.vocabulary_fingerprint import same_sentencepiece_model

logger = logging.getLogger("prepare_librispeech")

LIBRISPEECH_SUBSETS = ["train-clean-100", "train-clean-360", "train-other-500", "dev-clean", "dev-other",
                       "test-clean", "test-other"]
LM_DICTIONARY = "dict.txt"  # the dictionary again, where fairseq's language_modeling task (and LM fusion) reads it
MANIFEST_COLUMNS = ["id", "audio", "n_frames", "tgt_text", "speaker"]
CMVN_CHOICES = ("utterance", "global", "adaptive")  # --cmvn: fairseq's utterance_cmvn, global_cmvn, + adaptive_cmvn
GLOBAL_STATS_CMVNS = ("global", "adaptive")  # the --cmvn choices that need the training set's gcmvn.npz
DEFAULT_PRIOR_FRAMES = 300  # --cmvn adaptive: frames of the training statistics pooled with an utterance's own
GLOBAL_CMVN_VARIANCE_FLOOR = 1e-8  # fairseq's cal_gcmvn_stats (examples/speech_to_text/data_utils.py)
SPECAUGMENT_LD = {"freq_mask_F": 27, "freq_mask_N": 2, "time_mask_N": 2, "time_mask_T": 100, "time_mask_p": 1.0,
                  "time_wrap_W": 0}


@dataclass
class Utterance:
    """One utterance of a subset: its transcript line, its FLAC and where its features go."""

    id: str
    audio: Path  # the FLAC file
    text: str
    speaker: str
    features: Path  # where its filterbanks go


@dataclass(frozen=True)
class PreparationOptions:
    """How ``prepare`` prepares the subsets: ``ssm-prepare-librispeech``'s options besides the corpus, ``--out``
    and the subsets (see the module doc)."""

    vocab_size: int  # --vocab-size
    jobs: int  # --jobs: feature processes
    skip_bad: bool = False  # leave bad utterances out (listed in SUBSET.rejected.tsv) instead of failing
    combine_train: str | None = None  # also NAME.tsv with every training subset
    time_mask_width: int | None = SPECAUGMENT_LD["time_mask_T"]  # SpecAugment's widest time mask; None: none
    overwrite_vocabulary: bool = False
    cmvn: str = "utterance"  # one of CMVN_CHOICES
    prior_frames: float = DEFAULT_PRIOR_FRAMES  # --cmvn adaptive's prior_frames
    overwrite_cmvn: bool = False


@dataclass
class ExtractedSubset:
    """A subset after feature extraction: the utterances with features, their frames, the ``feature_sums`` of their
    features (``--cmvn global``, training subsets; else None) and every problem found in the subset."""

    utterances: list[Utterance]
    frames: dict[str, int]  # utterance id -> frames
    sums: np.ndarray | None
    problems: list[str]


class CorpusError(Exception):
    """Problems in the corpus, one line each, naming the file and utterance."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class VocabularyError(Exception):
    """This run's SentencePiece model or dictionary would replace a different one already in ``--out``."""


class CmvnError(Exception):
    """This run's ``--cmvn`` differs from the CMVN of the ``config.yaml`` already in ``--out``."""


def read_subset(root: Path, subset: str, out: Path) -> tuple[list[Utterance], list[str]]:
    """The utterances of ``root/subset`` in transcript order, and the problems found reading the layout."""
    directory = root / subset
    if not directory.is_dir():
        raise FileNotFoundError(f"subset {subset!r} not found: {directory} is not a directory")
    utterances, problems, transcribed = [], [], set()
    places: dict[str, list[str]] = {}  # utterance id -> every "FLAC (TRANSCRIPT:LINE)" that names it
    transcripts = sorted(directory.glob("*/*/*.trans.txt"))
    if not transcripts:
        problems.append(f"{directory}: no SPK/CHAPTER/SPK-CHAPTER.trans.txt files")
    for transcript in transcripts:
        for line_number, raw in enumerate(file_lines(transcript), 1):
            try:
                line = utf8(transcript, line_number, raw)
            except ValueError as error:
                problems.append(str(error))
                continue
            if not line.strip():
                continue
            utterance_id, _, text = line.strip().partition(" ")
            where = f"{transcript}:{line_number}: utterance {utterance_id}"
            audio = transcript.parent / f"{utterance_id}.flac"
            transcribed.add(audio)
            places.setdefault(utterance_id, []).append(f"{audio} ({transcript}:{line_number})")
            if not text.strip():
                problems.append(f"{where}: empty transcript")
            elif not audio.is_file():
                problems.append(f"{where}: audio file missing: {audio}")
            else:
                speaker = utterance_id.split("-")[0]
                utterances.append(Utterance(utterance_id, audio, " ".join(text.lower().split()), speaker,
                                            out / "fbank80" / subset / f"{utterance_id}.npy"))
    for audio in sorted(set(directory.glob("*/*/*.flac")) - transcribed):
        problems.append(f"{audio}: audio file with no line in its chapter's .trans.txt")
    shared = {utterance_id for utterance_id, named in places.items() if len(named) > 1}
    for utterance_id in sorted(shared):  # one feature file and one manifest id each: all of them are refused
        problems.append(f"utterance id {utterance_id} is used {len(places[utterance_id])} times in {subset}: "
                        f"{'; '.join(places[utterance_id])}; ids must be unique within a subset")
    return [u for u in utterances if u.id not in shared], problems


def refuse_ids_in_several_subsets(utterances: dict[str, list[Utterance]]) -> dict[str, dict[str, str]]:
    """Utterance ids that occur in more than one of the subsets prepared together: for each subset involved, each
    such id with its problem line naming every subset and recording. Such an id is the same recording in two
    subsets (training data in a test set) or two recordings under one id; either way it is left out of all."""
    where: dict[str, list[tuple[str, Path]]] = {}
    for subset, subset_utterances in utterances.items():
        for utterance in subset_utterances:
            where.setdefault(utterance.id, []).append((subset, utterance.audio))
    problems: dict[str, dict[str, str]] = {}
    for utterance_id, places in sorted(where.items()):
        if len(places) > 1:
            named = "; ".join(f"{subset}: {audio}" for subset, audio in places)
            for subset, _ in places:
                problems.setdefault(subset, {})[utterance_id] = (
                    f"utterance id {utterance_id} is in {len(places)} subsets ({named}); ids must be unique "
                    f"across the subsets prepared together (one recording in two subsets puts training data in an "
                    f"evaluation set, and a combined manifest would repeat the id)")
    return problems


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


def refuse_ids_prepared_before(utterances: dict[str, list[Utterance]], out: Path) -> dict[str, dict[str, str]]:
    """Utterance ids of the subsets being prepared that a manifest already in ``out`` gives to other features
    (another subset's): for each subset involved, each such id with its problem line naming the subset, the
    recording and the manifests. What ``refuse_ids_in_several_subsets`` refuses in subsets prepared together,
    refused in subsets added later (the existing manifests are left as they are). A manifest of the same subset,
    prepared before, or a ``--combine-train`` manifest holding it, names the same features: no conflict."""
    existing = prepared_ids(out)
    problems: dict[str, dict[str, str]] = {}
    for subset, subset_utterances in utterances.items():
        for utterance in subset_utterances:
            features = utterance.features.relative_to(out).as_posix()
            others = [(manifest, audio) for manifest, audio in existing.get(utterance.id, []) if audio != features]
            if others:
                named = "; ".join(f"{manifest} ({audio})" for manifest, audio in others)
                problems.setdefault(subset, {})[utterance.id] = (
                    f"utterance id {utterance.id} of {subset} ({utterance.audio}) is already in {named}; ids must be "
                    f"unique across the subsets of a data directory (one recording in two subsets puts training "
                    f"data in an evaluation set)")
    return problems


def source_stamp(audio: Path) -> str:
    """What identifies the audio a feature file was computed from: its place in the corpus (``SPK/CHAPTER/FILE``),
    size and modification time."""
    status = audio.stat()
    return f"{'/'.join(audio.parts[-3:])}\t{status.st_size}\t{status.st_mtime_ns}\n"


def stored_frames(utterance: Utterance, stamp: str) -> int | None:
    """The frames of the utterance's stored features if they are complete and computed from the audio as it is
    now (its ``.source`` stamp equals ``stamp``), else None (to compute: new, changed, or cut short)."""
    try:
        if utterance.features.with_suffix(".source").read_text(encoding="utf-8") != stamp:
            return None
        shape = npy_shape(utterance.features)
    except (OSError, ValueError):  # no stamp, a stamp that is not text, features cut short
        return None
    return shape[0] if len(shape) == 2 and shape[0] > 0 and shape[1] == NUM_MEL_BINS else None


def feature_sums(features: np.ndarray) -> np.ndarray:
    """``T x 80`` features -> ``2 x 80`` float64: each bin's sum over the frames, and its sum of squares."""
    features = features.astype(np.float64)
    return np.stack([features.sum(axis=0), np.square(features).sum(axis=0)])


def extract(utterance: Utterance, sums: bool = False) -> tuple[str, int | str, str | None, np.ndarray | None]:
    """Compute and store one utterance's features and source stamp -> ``(id, frames, conversion, sums)``, or
    ``(id, problem, None, None)``; features stored from the same audio are reused (``stored_frames``). ``sums``:
    also their ``feature_sums`` (read back from the stored file when reused), else None."""
    try:
        stamp = source_stamp(utterance.audio)
        frames = stored_frames(utterance, stamp)
        if frames is not None:
            if not sums:
                return utterance.id, frames, None, None
            try:
                return utterance.id, frames, None, feature_sums(np.load(utterance.features))
            except (OSError, ValueError):  # changed since its header was read: computed again below
                pass
        features, conversion = filterbank_features(utterance.audio)
    except AudioError as error:
        return utterance.id, f"{utterance.audio}: utterance {utterance.id}: {error.problem}", None, None
    except OSError as error:
        return utterance.id, f"{utterance.audio}: utterance {utterance.id}: unreadable audio ({error})", None, None
    stamp_file = utterance.features.with_suffix(".source")
    stamp_file.unlink(missing_ok=True)  # no stamp of other audio beside these features, even if we stop midway
    utterance.features.parent.mkdir(parents=True, exist_ok=True)
    partial = utterance.features.with_suffix(".partial.npy")
    np.save(partial, features)
    partial.replace(utterance.features)
    partial_stamp = stamp_file.with_suffix(".partial.source")
    partial_stamp.write_text(stamp, encoding="utf-8")
    partial_stamp.replace(stamp_file)
    return utterance.id, features.shape[0], conversion, feature_sums(features) if sums else None


def _init_worker() -> None:
    torch.set_num_threads(1)


def extract_all(utterances: list[Utterance], jobs: int, label: str,
                sums: bool = False) -> tuple[dict[str, int | str], np.ndarray | None]:
    """Features of every utterance on ``jobs`` processes, logging progress -> (id: frames or problem, the
    ``feature_sums`` of all the utterances with features if ``sums``, else None).

    The sums are accumulated in float64 in the order of ``utterances`` (``Pool.imap``, not ``imap_unordered``),
    whichever process finishes first, so that the same features give the same sums bit for bit."""
    results: dict[str, int | str] = {}
    total = np.zeros((2, NUM_MEL_BINS), dtype=np.float64) if sums else None
    work = functools.partial(extract, sums=True) if sums else extract
    conversions: dict[str, int] = {}
    start, every = time.time(), max(1, len(utterances) // 20)
    chunk = 8
    jobs = min(jobs, -(-len(utterances) // chunk))  # no process without a chunk of utterances to do
    with contextlib.ExitStack() as stack:
        if jobs > 1:
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(jobs, initializer=_init_worker))
            finished = (pool.imap if sums else pool.imap_unordered)(work, utterances, chunksize=chunk)
        else:
            finished = map(work, utterances)
        for done, (utterance_id, result, conversion, result_sums) in enumerate(finished, 1):
            results[utterance_id] = result
            if result_sums is not None:
                total += result_sums
            if conversion:
                conversions[conversion] = conversions.get(conversion, 0) + 1
            if done % every == 0 or done == len(utterances):
                elapsed = time.time() - start
                logger.info(f"{label}: {done}/{len(utterances)} utterances, {elapsed:.0f}s elapsed, "
                            f"about {elapsed / done * (len(utterances) - done):.0f}s left")
    for conversion, count in sorted(conversions.items()):
        logger.info(f"{label}: {count} utterances not 16 kHz mono: {conversion} (to 16 kHz mono)")
    return results, total


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


MIN_VOCAB_SIZE = 5  # SentencePiece's <s>, <pad>, </s>, <unk> and one piece


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


def configured_cmvn(config: dict) -> str:
    """The CMVN a ``config.yaml`` (as a dict) applies: ``"adaptive"``, ``"global"``, ``"utterance"`` or ``"none"``."""
    transforms = config.get("feature_transforms") or config.get("transforms") or {}
    names = {name for names in transforms.values() for name in (names or [])}
    for cmvn, transform in (("adaptive", ADAPTIVE_CMVN), ("global", "global_cmvn"), ("utterance", "utterance_cmvn")):
        if transform in names:
            return cmvn
    return "none"


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


def check_cmvn(out: Path, cmvn: str, overwrite: bool) -> None:
    """``CmvnError`` if ``out/config.yaml`` exists and applies another CMVN than ``cmvn`` (unless ``overwrite``, which
    logs a warning): models trained on ``out`` were trained on features normalised the other way."""
    path = out / "config.yaml"
    if not path.is_file():
        return
    existing = configured_cmvn(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
    if existing == cmvn:
        return
    if not overwrite:
        raise CmvnError(
            f"this run's --cmvn {cmvn} differs from {path}, which uses {existing} CMVN and which models trained on "
            f"{out} use (their features were normalised the other way): prepare into a new --out, or pass "
            f"--overwrite-cmvn to replace it")
    logger.warning(f"--overwrite-cmvn: {path} switches from {existing} to {cmvn} CMVN; checkpoints trained on it "
                   f"no longer get the features they were trained on")


def global_cmvn_stats(frames: int, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``frames`` and the ``2 x 80`` float64 sums of their values and squares -> (mean, std), ``80`` float32 each,
    as fairseq's ``cal_gcmvn_stats`` computes them (variance floored at 1e-8). No frames: ``ValueError``."""
    if frames < 1:
        raise ValueError("global CMVN: the training subsets have no frames (every utterance was left out)")
    mean = sums[0] / frames
    variance = sums[1] / frames - mean ** 2
    std = np.sqrt(np.maximum(variance, GLOBAL_CMVN_VARIANCE_FLOOR))
    return mean.astype(np.float32), std.astype(np.float32)


def write_global_cmvn(out: Path, mean: np.ndarray, std: np.ndarray) -> Path:
    """``out/gcmvn.npz`` (``mean``, ``std``, as fairseq's ``GlobalCMVN`` reads them), written atomically -> its
    path. A different one already there is replaced with a warning."""
    path = out / GLOBAL_CMVN_STATS
    if path.is_file():
        try:
            with np.load(path) as before:
                same = np.array_equal(before["mean"], mean) and np.array_equal(before["std"], std)
        except (OSError, ValueError, KeyError):
            same = False
        if same:
            return path
        logger.warning(f"{path}: replacing the global CMVN statistics of an earlier preparation (other training "
                       f"audio?); checkpoints trained on {out} were trained with the old ones")
    partial = path.with_name(f"{path.stem}.partial.npz")
    with open(partial, "wb") as f:
        np.savez(f, mean=mean, std=std)
    partial.replace(path)
    return path


def write_config(out: Path, spm_name: str, time_mask_width: int | None = SPECAUGMENT_LD["time_mask_T"],
                 global_cmvn: bool = False, prior_frames: float | None = None) -> None:
    """``config.yaml``, written atomically; ``time_mask_width`` None: no SpecAugment; ``global_cmvn``: global CMVN
    with ``gcmvn.npz``, else utterance CMVN; ``prior_frames`` (with ``global_cmvn``): then ``adaptive_cmvn`` with
    that prior. Paths are relative to ``out`` (``audio_root: .``), which the
    ``speech_transducer`` task resolves against the data directory (``ssm_fairseq.asr.transducer.data_config``), so it
    can move."""
    cmvn = "global_cmvn" if global_cmvn else "utterance_cmvn"
    config = {
        "input_feat_per_channel": 80,
        "audio_root": ".",
        "vocab_filename": f"{spm_name}.txt",
        "bpe_tokenizer": {"bpe": "sentencepiece", "sentencepiece_model": f"{spm_name}.model"},
        "feature_transforms": {"_train": [cmvn], "*": [cmvn]},
    }
    if global_cmvn:
        config["global_cmvn"] = {"stats_npz_path": GLOBAL_CMVN_STATS}
        if prior_frames is not None:
            for names in config["feature_transforms"].values():
                names.append(ADAPTIVE_CMVN)
            config[ADAPTIVE_CMVN] = {"prior_frames": int(prior_frames) if float(prior_frames).is_integer()
                                     else prior_frames}
    if time_mask_width is not None:
        config["specaugment"] = {**SPECAUGMENT_LD, "time_mask_T": time_mask_width}
        config["feature_transforms"]["_train"].append("specaugment")
    path = out / "config.yaml"
    if path.is_file():
        before, after = (_located(c, out) for c in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}, config))
        changed = sorted(key for key in set(before) | set(after) if before.get(key) != after.get(key))
        if changed:  # e.g. SpecAugment switched on or off: training resumed on this directory changes with it
            logger.warning(f"{path}: replacing the data configuration of an earlier preparation (changed: "
                           f"{', '.join(changed)}); checkpoints trained on it were trained with the old one")
    replace_file(path, yaml.safe_dump(config, sort_keys=False).encode("utf-8"))


def _located(config: dict, out: Path) -> dict:
    """``config`` with its paths (``audio_root``, the global CMVN statistics) absolute: an earlier release wrote
    them absolute, this one relative to ``out``, and the two name the same files."""
    located = dict(config)
    if "audio_root" in config:
        located["audio_root"] = str((out / config["audio_root"]).resolve())
    stats = (config.get("global_cmvn") or {}).get("stats_npz_path")
    if stats:
        located["global_cmvn"] = {**config["global_cmvn"], "stats_npz_path": str((out / stats).resolve())}
    return located


def check_subsets(out: Path, subsets: list[str], train_subsets: list[str], cmvn: str) -> None:
    """``ValueError`` for a ``cmvn`` not in ``CMVN_CHOICES``, training subsets that are not among ``subsets``, or
    global CMVN with no training subset to compute it on (and no prepared ``out`` to add evaluation subsets to)."""
    if cmvn not in CMVN_CHOICES:
        raise ValueError(f"--cmvn {cmvn}: expected one of {', '.join(CMVN_CHOICES)}")
    if not set(train_subsets) <= set(subsets):
        raise ValueError(f"training subsets {train_subsets} must be among the subsets {subsets}")
    if cmvn in GLOBAL_STATS_CMVNS and not train_subsets and not (out / "config.yaml").is_file():
        raise ValueError(f"--cmvn {cmvn} computes its statistics on the training subsets, and none of {subsets} is "
                         f"one (--train-subsets, or by default the subsets whose name starts with 'train'): prepare "
                         f"the training subsets with them, or use --cmvn utterance")


def read_subsets(root: Path, out: Path, subsets: list[str]) -> dict[str, tuple[list[Utterance], list[str]]]:
    """Each subset's utterances and problems (``read_subset``), less the ids that another subset prepared with it
    or a manifest already in ``out`` also has (listed among its problems instead)."""
    read = {subset: read_subset(root, subset, out) for subset in subsets}
    read_utterances = {s: u for s, (u, _) in read.items()}
    for refusals in (refuse_ids_in_several_subsets(read_utterances), refuse_ids_prepared_before(read_utterances, out)):
        for subset, refused in refusals.items():
            utterances, problems = read[subset]
            read[subset] = ([u for u in utterances if u.id not in refused], problems + list(refused.values()))
    return read


def extract_subset(out: Path, subset: str, utterances: list[Utterance], problems: list[str], jobs: int,
                   sums: bool) -> ExtractedSubset:
    """The features of a subset's ``utterances`` (``extract_all``); the problems of reading it (``problems``, which
    the extraction's are added to) logged as errors and listed in ``out/SUBSET.rejected.tsv`` (removed when there
    are none)."""
    results, subset_sums = extract_all(utterances, jobs, subset, sums)
    problems += [result for result in results.values() if isinstance(result, str)]
    frames = {uid: result for uid, result in results.items() if isinstance(result, int)}
    rejected = out / f"{subset}.rejected.tsv"
    rejected.unlink(missing_ok=True)  # no list left from an earlier run
    if problems:
        for problem in problems:
            logger.error(problem)
        rejected.write_text("".join(p + "\n" for p in problems), encoding="utf-8")
    return ExtractedSubset([u for u in utterances if u.id in frames], frames, subset_sums, problems)


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


def write_manifests(out: Path, subsets: list[str], extracted: dict[str, ExtractedSubset],
                    added_to: str | None = None) -> None:
    """``out/SUBSET.tsv`` for each of ``subsets``, logged with its utterances and hours, or, for subsets ``added_to``
    the vocabulary of a prepared directory, with that vocabulary."""
    for subset in subsets:
        done = extracted[subset]
        write_manifest(out / f"{subset}.tsv", done.utterances, done.frames, out)
        if added_to is not None:
            logger.info(f"{subset}: {len(done.utterances)} utterances -> {out / subset}.tsv, with the vocabulary "
                        f"{added_to} and the config.yaml already in {out} (unchanged)")
        else:
            hours = sum(done.frames.values()) / 360000
            logger.info(f"{subset}: {len(done.utterances)} utterances, {hours:.2f} h -> {out / subset}.tsv")


def write_combined_manifest(out: Path, name: str, train_subsets: list[str]) -> None:
    """``out/NAME.tsv``: the rows of every training subset's manifest under one header (``--combine-train``)."""
    manifests = [(out / f"{subset}.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
                 for subset in train_subsets]
    rows = [row for manifest in manifests for row in manifest[1:]]
    replace_file(out / f"{name}.tsv", "".join(manifests[0][:1] + rows).encode("utf-8"))


def update_global_cmvn(out: Path, global_cmvn: bool, train_subsets: list[str],
                       extracted: dict[str, ExtractedSubset]) -> None:
    """With ``global_cmvn``, ``out/gcmvn.npz`` from the training subsets' feature sums; else a ``gcmvn.npz`` left by
    an earlier global-CMVN preparation is removed."""
    if global_cmvn:  # in a fixed order, so that the same features give the same statistics bit for bit
        training = list(dict.fromkeys(train_subsets))  # each subset once
        count = sum(sum(extracted[subset].frames.values()) for subset in training)
        mean, std = global_cmvn_stats(count, sum(extracted[subset].sums for subset in training))
        logger.info(f"global CMVN over {count} frames of {', '.join(training)} -> {write_global_cmvn(out, mean, std)}")
    else:
        stale = out / GLOBAL_CMVN_STATS
        if stale.is_file():  # left by a --cmvn global preparation that --overwrite-cmvn replaced
            stale.unlink()
            logger.warning(f"{stale}: removed (this directory now uses utterance CMVN)")


def prepare(root: Path, out: Path, subsets: list[str], train_subsets: list[str], options: PreparationOptions) -> None:
    """Features, manifests, SentencePiece model and ``config.yaml`` for ``subsets`` of ``root`` (see module doc);
    ``options.cmvn``: ``"utterance"``, ``"global"`` or ``"adaptive"`` (the last two also ``gcmvn.npz``, from the
    ``train_subsets``).

    Raises ``CorpusError`` listing every problem unless ``options.skip_bad``, ``VocabularyError`` (before any
    manifest is written) if the vocabulary would replace a different one unless ``options.overwrite_vocabulary``,
    ``CmvnError`` (before any feature is computed) if ``out/config.yaml`` applies another CMVN unless
    ``options.overwrite_cmvn``, and ``ValueError`` for ``cmvn`` global without training subsets.
    """
    check_subsets(out, subsets, train_subsets, options.cmvn)
    out.mkdir(parents=True, exist_ok=True)
    check_cmvn(out, options.cmvn, options.overwrite_cmvn)
    added_to = None if train_subsets else prepared_vocabulary(out, subsets)  # evaluation subsets only
    read = read_subsets(root, out, subsets)
    extracted: dict[str, ExtractedSubset] = {}
    all_problems: list[str] = []
    for subset in subsets:
        sums = options.cmvn in GLOBAL_STATS_CMVNS and subset in train_subsets
        extracted[subset] = extract_subset(out, subset, *read[subset], options.jobs, sums)
        all_problems += extracted[subset].problems
    if all_problems and not options.skip_bad:
        raise CorpusError(all_problems)
    if added_to is not None:
        write_manifests(out, subsets, extracted, added_to)
        return
    spm_name = train_vocabulary(out, train_subsets, extracted, options.vocab_size, options.overwrite_vocabulary)
    write_manifests(out, subsets, extracted)
    if options.combine_train:
        write_combined_manifest(out, options.combine_train, train_subsets)
    update_global_cmvn(out, options.cmvn in GLOBAL_STATS_CMVNS, train_subsets, extracted)
    write_config(out, spm_name, options.time_mask_width, options.cmvn in GLOBAL_STATS_CMVNS,
                 options.prior_frames if options.cmvn == "adaptive" else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--librispeech-root", type=Path, required=True,
                        help="directory holding the subsets (LibriSpeech/ in the openslr archives)")
    parser.add_argument("--out", type=Path, required=True, help="output data directory")
    parser.add_argument("--subsets", default=",".join(LIBRISPEECH_SUBSETS), help="comma-separated subsets")
    parser.add_argument("--train-subsets", default=None,
                        help="subsets for SentencePiece (default: those whose name starts with 'train')")
    parser.add_argument("--combine-train", default=None, metavar="NAME",
                        help="also write NAME.tsv with every training subset (e.g. train-960)")
    parser.add_argument("--vocab-size", type=int, default=4096, help="SentencePiece units (default 4096)")
    parser.add_argument("--time-mask-width", type=int, default=SPECAUGMENT_LD["time_mask_T"],
                        help="SpecAugment's widest time mask in frames (100, LibriSpeech's LD policy)")
    parser.add_argument("--no-specaugment", action="store_true", help="no SpecAugment on training subsets")
    parser.add_argument("--cmvn", choices=CMVN_CHOICES, default="utterance",
                        help="utterance: each utterance normalised by its own mean and std (default); global: by the "
                             "training subsets' mean and std per bin (gcmvn.npz), which streaming models need; "
                             "adaptive: global, then by the running statistics of the utterance so far pooled with "
                             "--cmvn-prior-frames frames of the training set's (causal: streams too)")
    parser.add_argument("--cmvn-prior-frames", type=float, default=DEFAULT_PRIOR_FRAMES,
                        help=f"--cmvn adaptive: frames of the training statistics pooled with an utterance's own "
                             f"(default {DEFAULT_PRIOR_FRAMES}; inf: global CMVN alone)")
    parser.add_argument("--jobs", type=int, default=multiprocessing.cpu_count(), help="feature processes")
    parser.add_argument("--skip-bad", action="store_true",
                        help="leave out bad utterances (listed in SUBSET.rejected.tsv) instead of failing")
    parser.add_argument("--overwrite-vocabulary", action="store_true",
                        help="replace a different SentencePiece model / dictionary already in --out (models "
                             "trained on it will no longer match)")
    parser.add_argument("--overwrite-cmvn", action="store_true",
                        help="switch a --out prepared with the other --cmvn (models trained on it will no longer "
                             "get the features they were trained on)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    if args.vocab_size < MIN_VOCAB_SIZE:
        parser.error(f"--vocab-size {args.vocab_size}: SentencePiece needs at least {MIN_VOCAB_SIZE} units (its "
                     f"{MIN_VOCAB_SIZE - 1} special symbols and one piece)")
    subsets = [s for s in args.subsets.split(",") if s]
    train_subsets = ([s for s in args.train_subsets.split(",") if s] if args.train_subsets
                     else [s for s in subsets if s.startswith("train")])
    for flag, names in (("--subsets", subsets), ("--train-subsets", train_subsets)):
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            parser.error(f"{flag} names {', '.join(twice)} more than once")
    try:
        prepare(args.librispeech_root, args.out, subsets, train_subsets, PreparationOptions(
            vocab_size=args.vocab_size, jobs=args.jobs, skip_bad=args.skip_bad, combine_train=args.combine_train,
            time_mask_width=None if args.no_specaugment else args.time_mask_width,
            overwrite_vocabulary=args.overwrite_vocabulary, cmvn=args.cmvn, overwrite_cmvn=args.overwrite_cmvn,
            prior_frames=check_prior_frames(args.cmvn_prior_frames)))
    except CorpusError as error:
        logger.error(f"{len(error.problems)} problem(s) in the corpus (listed above); fix them or pass --skip-bad")
        return 1
    except (FileNotFoundError, ValueError, VocabularyError, CmvnError) as error:
        logger.error(str(error))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
