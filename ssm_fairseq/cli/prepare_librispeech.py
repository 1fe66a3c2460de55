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
  followed by this package's ``adaptive_cmvn`` (``ssm_fairseq.asr.features.running_cmvn``: each frame also
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
import logging
import multiprocessing
import sys
from dataclasses import dataclass
from pathlib import Path

from ssm_fairseq.asr.features.running_cmvn import check_prior_frames
from ssm_fairseq.asr.preparation.cmvn import (
    CMVN_CHOICES, DEFAULT_PRIOR_FRAMES, GLOBAL_STATS_CMVNS, CmvnError, check_cmvn, update_global_cmvn,
)
from ssm_fairseq.asr.preparation.config_file import SPECAUGMENT_LD, write_config
from ssm_fairseq.asr.preparation.corpus import LIBRISPEECH_SUBSETS, CorpusError, read_subsets
from ssm_fairseq.asr.preparation.features import ExtractedSubset, extract_subset
from ssm_fairseq.asr.preparation.manifests import write_combined_manifest, write_manifest
from ssm_fairseq.asr.preparation.vocabulary import (
    MIN_VOCAB_SIZE, VocabularyError, prepared_vocabulary, train_vocabulary,
)

logger = logging.getLogger("prepare_librispeech")


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
