"""Task ``speech_transducer``: fairseq's ``speech_to_text`` data, trained and decoded as a transducer.

Data (manifests, ``config.yaml``, SpecAugment, CMVN, SentencePiece) is fairseq's speech-to-text layer unchanged;
``ssm-prepare-librispeech`` (``scripts/prepare_librispeech.py``) writes it. This task builds the ``transducer``
models and, for ``fairseq-generate``, the transducer search (``--beam 1`` greedy, ``--beam N`` beam search, ``--nbest``,
``--max-symbols-per-frame``, ``--search modified`` (one label per frame), ``--blank-penalty``, fairseq's
``--lenpen`` / ``--unnormalized`` for beam search's final ranking, and fairseq's ``--lm-path`` / ``--lm-weight``
for shallow fusion with a language model over the same units, with ``--lm-eos`` / ``--no-lm-eos``). Decoding
stops, naming the utterance, at features with NaN or inf (training drops them: see the ``transducer``
criterion); ``--arch`` must be a transducer.

The model's configuration records the dictionary and the features it is trained with: when training starts,
``build_model`` stores the SHA-256 of the dictionary of units and of the SentencePiece model (``config.yaml``'s
``vocab_filename`` and ``bpe_tokenizer.sentencepiece_model``; the model also by content, its pieces, scores, types
and normalization, not the paths it records: ``vocabulary_fingerprint``) and, as the role ``features``, the features of
evaluation splits (``input_feat_per_channel``, the feature transforms for ``_eval`` splits with their options, e.g.
``utterance_cmvn`` or ``global_cmvn``, and the SHA-256 of ``global_cmvn.stats_npz_path``) as
``cfg.model.dictionary_fingerprint``, which fairseq saves in every checkpoint. Building a model from a checkpoint
(``fairseq-generate --path``, ``ssm_fairseq.transcribe``) refuses a data directory whose dictionary files differ
(``DictionaryMismatchError``: its labels would decode to other units), then one whose features differ
(``FeatureMismatchError``: another CMVN, other global CMVN statistics, other transforms or width; the model would
transcribe features normalised otherwise than in training). Files are compared by content: the same statistics at
another path, and a SentencePiece model trained again on the same transcripts elsewhere, are accepted. Checkpoints
saved before fingerprints, or before the features were recorded, are accepted with a warning. ``config.yaml``'s
``audio_root`` and global CMVN statistics are read relative to the data directory (``data_config``), so a moved
data directory decodes.
"""
from __future__ import annotations

import argparse
import logging
import math
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from fairseq.data.audio.speech_to_text_dataset import SpeechToTextDatasetCreator
from fairseq.tasks import LegacyFairseqTask, register_task
from fairseq.tasks.speech_to_text import SpeechToTextTask
from omegaconf import DictConfig, open_dict

from ...integrity.checkpoint_checks import EVALUATION_SPLIT, FEATURES_ROLE, FINGERPRINT_KEY, DictionaryMismatchError, \
    FeatureMismatchError, dictionary_fingerprint, feature_fingerprint, fingerprint_differences
from ...integrity.feature_check import non_finite_utterances
from ...integrity.language_model_check import check_language_model
from ...integrity.manifest_check import check_manifest
from ...integrity.task_check import check_arch_when_parsed, speech_task_arch_error, speech_task_option_clash
from ..options import MAX_SYMBOLS_PER_FRAME, SEARCHES  # torch-free, with the decoding options
from ..search import TransducerGenerator
from ..search.bigram_lm import BigramLM
from ..search.lm_fusion import check_lm_weight
from .data_config import DataDirectoryConfig
from .seeded_items import SeededItems


logger = logging.getLogger(__name__)

# speech_to_text is an argparse task, so its checkpoints hold an argparse.Namespace; torch >= 2.6 loads
# checkpoints with weights_only=True, which refuses it unless it is allow-listed (fairseq 0.12 predates this).
torch.serialization.add_safe_globals([argparse.Namespace])


class PiecesOrTextDecoder:
    """The config's SentencePiece tokenizer, whose ``decode`` leaves already-decoded text alone.

    ``fairseq-generate --post-process sentencepiece`` turns pieces into words before it calls the task's
    tokenizer; decoding words again would delete their spaces. The task cannot see ``--post-process``, so the
    decoder tells the two runs apart by their strings: fairseq's post-processing removes every word-boundary
    mark, and a reference in pieces starts with one. Once a string with the mark has been decoded (the first
    reference, decoded before its hypotheses), every later string of the run is pieces, also a hypothesis made
    only of word-internal pieces; before that, text is returned as it is. WER is the same with and without
    ``--post-process``.
    """

    WORD_BOUNDARY = "\u2581"

    def __init__(self, bpe):
        self.bpe = bpe
        self.pieces = False

    def encode(self, text: str) -> str:
        return self.bpe.encode(text)

    def decode(self, text: str) -> str:
        self.pieces = self.pieces or self.WORD_BOUNDARY in text
        return self.bpe.decode(text) if self.pieces else text


@register_task("speech_transducer")
class SpeechTransducerTask(SpeechToTextTask):
    """``--task speech_transducer``: fairseq's ``speech_to_text`` data (``DATA/config.yaml``, ``SPLIT.tsv``) for
    ``*_transducer`` models, decoded by transducer search in ``fairseq-generate``.

    Options besides ``speech_to_text``'s: ``--search exact|modified``, ``--max-symbols-per-frame N``,
    ``--blank-penalty P`` and ``--lm-eos`` / ``--no-lm-eos``; ``--beam``, ``--nbest``, ``--lenpen``,
    ``--unnormalized``, ``--lm-path`` and ``--lm-weight`` are fairseq's; ``--ilm-path`` and ``--ilm-weight`` add LODR to the
    fusion. Manifests
    are checked when loaded, and the dictionary and features are checked against those a checkpoint was trained
    with.
    """

    @classmethod
    def add_args(cls, parser):
        """The task's options; ``--arch`` of another model family stops the parser in one line (``task_check``)."""
        try:
            cls._add_task_args(parser)
        except argparse.ArgumentError as error:  # fairseq has just added the model's options: a foreign model's
            parser.exit(2, f"{parser.prog}: error: {speech_task_option_clash(error)}\n")
        check_arch_when_parsed(parser, speech_task_arch_error)

    @classmethod
    def _add_task_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--max-symbols-per-frame", type=int, default=MAX_SYMBOLS_PER_FRAME, metavar="N",
                            help="transducer search: labels a hypothesis may emit within one encoder frame before "
                                 "it moves on to the next frame (no blank is scored for the move)")
        parser.add_argument("--search", choices=SEARCHES, default="exact",
                            help="exact: frame-synchronous search, up to --max-symbols-per-frame labels per frame; "
                                 "modified: icefall's modified beam search, one label per frame")
        parser.add_argument("--blank-penalty", type=float, default=0.0, metavar="P",
                            help="subtract P from the blank's logit during search (more labels, fewer deletions); "
                                 "scores are then those of the penalised distribution")
        parser.add_argument("--lm-eos", action=argparse.BooleanOptionalAction, default=True,
                            help="with --lm-path: add the LM's end-of-sentence score (times --lm-weight) to every "
                                 "finished hypothesis (default; --no-lm-eos leaves it out)")
        parser.add_argument("--ilm-path", default=None, metavar="FILE",
                            help="LODR: the bigram of the training transcripts (scripts/build_bigram.py), subtracted "
                                 "times --ilm-weight from every emitted unit's fused score (needs --lm-path)")
        parser.add_argument("--ilm-weight", type=float, default=0.0, metavar="W",
                            help="LODR: the bigram's weight, finite and >= 0 (default 0: off)")

    @classmethod
    def setup_task(cls, args, **kwargs):
        """As ``speech_to_text``; with ``fairseq-generate --lm-path``, first the checks fairseq-generate runs too late
        or not at all (it sets the task up before it loads the LM): ``--lm-weight`` a finite number >= 0, the data
        directory has the ``dict.txt`` fairseq loads the LM with (fairseq's LM convention; it names no file), and the
        checkpoint is a language model trained over that dictionary's units in its order (``check_language_model``)."""
        lm_path = getattr(args, "lm_path", None)
        if lm_path:
            check_lm_weight(getattr(args, "lm_weight", 0.0) or 0.0)
            check_language_model(lm_path, args.data)
        return super().setup_task(args, **kwargs)

    def __init__(self, args, tgt_dict):
        super().__init__(args, tgt_dict)
        # config.yaml's audio_root and global CMVN statistics read relative to the data directory, which may move
        self.data_cfg = DataDirectoryConfig(Path(args.data) / args.config_yaml)

    def build_model(self, cfg, from_checkpoint: bool = False):
        error = speech_task_arch_error(getattr(cfg, "_name", None) or getattr(cfg, "arch", None))
        if error is not None:
            raise ValueError(error)
        # speech_to_text's build_model also writes input_channels and speaker_to_id, which the transducer's
        # dataclass config does not have; the transducer needs only the feature width.
        if self.data_cfg.input_channels != 1:
            raise ValueError(f"transducer models read one feature channel; {self.args.config_yaml} "
                             f"sets input_channels: {self.data_cfg.input_channels}")
        if from_checkpoint:
            trained_with = getattr(cfg, FINGERPRINT_KEY, None)
            self.check_dictionary(trained_with)
            self.check_features(trained_with)
        with open_dict(cfg) if isinstance(cfg, DictConfig) else nullcontext():
            cfg.input_feat_per_channel = self.data_cfg.input_feat_per_channel
        model = LegacyFairseqTask.build_model(self, cfg, from_checkpoint)
        if not from_checkpoint:  # training starts (or resumes): fairseq saves cfg.model in every checkpoint
            with open_dict(cfg) if isinstance(cfg, DictConfig) else nullcontext():
                setattr(cfg, FINGERPRINT_KEY, {**self.dictionary_fingerprint(),
                                               FEATURES_ROLE: self.feature_fingerprint()})
        return model

    def dictionary_fingerprint(self) -> dict:
        """The SHA-256 of this data directory's dictionary of units and SentencePiece model (those that exist; the
        model also by content: ``vocabulary_fingerprint``)."""
        root = Path(self.args.data)
        files = {"dictionary": root / self.data_cfg.vocab_filename}
        model = self.data_cfg.bpe_tokenizer.get("sentencepiece_model") if self.data_cfg.bpe_tokenizer else None
        if model:
            files["sentencepiece_model"] = root / model
        return dictionary_fingerprint(files)

    def feature_fingerprint(self) -> dict:
        """The features this data directory gives splits not trained on (``checkpoint_checks.feature_fingerprint``:
        ``input_feat_per_channel``, the ``_eval`` feature transforms, the global CMVN statistics' SHA-256)."""
        return feature_fingerprint(self.data_cfg, EVALUATION_SPLIT)

    def check_dictionary(self, trained_with) -> None:
        """Refuse to decode a model trained with other dictionary files (``trained_with``: its stored fingerprint,
        None for a checkpoint saved before fingerprints, which is accepted with a warning)."""
        if trained_with is None:
            logger.warning("the checkpoint records no dictionary fingerprint (saved by an earlier version): cannot "
                           f"check that it was trained with {self.args.data}'s dictionary")
            return
        differences = fingerprint_differences(trained_with, self.dictionary_fingerprint(), "the checkpoint (at "
                                              "training)", "this data directory")
        if differences:
            raise DictionaryMismatchError(f"trained with other dictionary files than {self.args.data}'s, so its "
                                          f"labels would decode to other units: {'; '.join(differences)}. Decode "
                                          f"with the data directory it was trained on")

    def check_features(self, trained_with) -> None:
        """Refuse to decode a model trained on other features (``trained_with``: its stored fingerprint; one
        without the ``features`` role, saved by an earlier version, is accepted with a warning)."""
        if FEATURES_ROLE not in (trained_with or {}):
            logger.warning("the checkpoint records no feature fingerprint (saved by an earlier version): cannot check "
                           f"that it was trained on the features of {self.args.data} (feature transforms, CMVN "
                           f"statistics)")
            return
        differences = fingerprint_differences({FEATURES_ROLE: trained_with[FEATURES_ROLE]},
                                              {FEATURES_ROLE: self.feature_fingerprint()},
                                              "the checkpoint (at training)", "this data directory")
        if differences:
            config = Path(self.args.data) / self.args.config_yaml
            raise FeatureMismatchError(f"trained on other features than {config} gives, so its transcripts would be "
                                       f"garbage: {'; '.join(differences)}. Decode with the data directory it was "
                                       f"trained on")

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        """As ``speech_to_text``, except what counts as a training split (SpecAugment, shuffling, fairseq's batch
        multiple): the ``--train-subset`` that ``fairseq-train`` loads for training, not any split whose name
        starts with ``train``. ``fairseq-generate --gen-subset train-clean-100`` scores every utterance, unaugmented.
        Every manifest row is checked first (``manifest_check``): a bad one stops the run naming its line. The
        training split's SpecAugment masks are drawn per (seed, epoch, utterance) (``SeededItems``), so a run
        resumed from a checkpoint trains on the same masks as the uninterrupted run.
        """
        is_train_split = combine and split == getattr(self.args, "train_subset", None)
        for name in split.split(","):
            check_manifest(self.args.data, name, self.data_cfg.input_feat_per_channel, self.data_cfg.audio_root)
        dataset = SpeechToTextDatasetCreator.from_tsv(
            root=self.args.data, cfg=self.data_cfg, splits=split, tgt_dict=self.tgt_dict,
            pre_tokenizer=self.build_tokenizer(self.args), bpe_tokenizer=self.build_bpe(self.args),
            is_train_split=is_train_split, epoch=epoch, seed=self.args.seed, speaker_to_id=self.speaker_to_id,
            multitask=self.multitask_tasks,
        )
        self.datasets[split] = SeededItems(dataset, self.args.seed) if is_train_split else dataset

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if hasattr(criterion, "set_num_updates"):  # the pruned RNN-T loss's warm-up follows the update count
            criterion.set_num_updates(update_num)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def get_batch_iterator(self, dataset, required_batch_size_multiple=1, **kwargs):
        """fairseq's batches, with every utterance batched, and ``--max-tokens`` below an utterance's length refused
        in one line naming the longest such utterance (fairseq asserts, naming none)."""
        # fairseq 0.12 batches by --max-tokens with --required-batch-size-multiple (8 by default) by dropping
        # utterances that do not fill a multiple (measured: 7 of the mini corpus's 600 in every epoch, and on a
        # sorted corpus always the same ones); in validation and decoding they would also be left out of the loss
        # and the WER. Every utterance is batched: the multiple is 1 here, whatever the flag says.
        try:
            return super().get_batch_iterator(dataset, required_batch_size_multiple=1, **kwargs)
        except AssertionError as error:
            max_tokens = kwargs.get("max_tokens")
            if max_tokens is None or "max_tokens" not in str(error):
                raise
            raise ValueError(self._longer_than_max_tokens(dataset, max_tokens)) from error

    def _longer_than_max_tokens(self, dataset, max_tokens: int) -> str:
        """The error for utterances of ``dataset`` longer than ``max_tokens`` frames, naming the longest."""
        sizes = np.array([dataset.num_tokens(i) for i in range(len(dataset))])
        too_long = np.flatnonzero(sizes > max_tokens)
        longest = int(too_long[sizes[too_long].argmax()])
        split = next((name for name, loaded in self.datasets.items() if loaded is dataset), None)
        return (f"{self.utterance_name(longest, split)}: {sizes[longest]} frames, more than --max-tokens "
                f"{max_tokens} lets into a batch ({len(too_long)} utterance(s) of the split are longer): raise "
                f"--max-tokens to at least {sizes[longest]}")

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """Decode a batch, or stop naming its utterances whose features hold NaN or inf (their hypotheses would be
        garbage inside the WER)."""
        net_input = sample["net_input"]
        unreadable = non_finite_utterances(net_input["src_tokens"], net_input["src_lengths"])
        if unreadable.any():
            names = "; ".join(self.utterance_name(int(i)) for i in sample["id"][unreadable].tolist())
            raise ValueError(f"{names}: features are not finite (NaN or inf); decoding stops rather than score "
                             f"garbage (re-extract the features or remove the utterance from the manifest)")
        return super().inference_step(generator, models, sample, prefix_tokens, constraints)

    def utterance_name(self, sample_id: int, split: str | None = None) -> str:
        """``sample_id`` of ``split`` (default: the split being decoded, ``--gen-subset``) by its manifest and
        manifest id."""
        split = split or getattr(self.args, "gen_subset", None)
        ids = getattr(self.datasets.get(split), "ids", None)  # one manifest's dataset; a concatenation has none
        if ids is None:
            return f"sample id {sample_id}" + (f" of split {split}" if split else "")
        return f"{self.args.data}/{split}.tsv: utterance {ids[sample_id]!r} (sample id {sample_id})"

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None):
        if getattr(args, "prefix_size", 0) > 0:
            raise ValueError("transducer search does not take --prefix-size")
        # fairseq's ranking flags: hypotheses compare by score / (len + 1) ** lenpen, or by score (--unnormalized)
        length_norm = 0.0 if getattr(args, "unnormalized", False) else getattr(args, "lenpen", 1.0)
        blank_penalty = getattr(self.args, "blank_penalty", 0.0)
        for flag, value in (("--lenpen", length_norm), ("--blank-penalty", blank_penalty)):
            if not math.isfinite(value):
                raise ValueError(f"{flag} must be a finite number, got {value}")
        limit = 1 if getattr(self.args, "search", "exact") == "modified" else self.args.max_symbols_per_frame
        # fairseq-generate converts the model for --fp16 (model.half()) but not for --bf16: the generator does
        dtype = torch.bfloat16 if getattr(self.args, "bf16", False) else None
        fusion = extra_gen_cls_kwargs or {}  # fairseq-generate's --lm-path model and --lm-weight
        # LODR: a recognizer passes its bigram and weight; fairseq-generate has them among the task's options
        ilm_path = getattr(self.args, "ilm_path", None)
        ilm = fusion["ilm"] if "ilm" in fusion else (BigramLM.load(ilm_path) if ilm_path else None)
        ilm_weight = fusion["ilm_weight"] if "ilm_weight" in fusion else getattr(self.args, "ilm_weight", 0.0) or 0.0
        if fusion.get("lm_model") is not None and not fusion.get("lm_weight"):
            logger.warning("--lm-path without --lm-weight (or with 0): the language model does not change the search")
        return TransducerGenerator(models, self.target_dictionary, beam=args.beam, nbest=args.nbest,
                                   max_symbols_per_frame=limit, length_norm=length_norm,
                                   blank_penalty=blank_penalty, lm_model=fusion.get("lm_model"),
                                   lm_weight=fusion.get("lm_weight") or 0.0, lm_eos=getattr(self.args, "lm_eos", True),
                                   dtype=dtype, ilm=ilm, ilm_weight=ilm_weight)

    def build_bpe(self, args):
        bpe = super().build_bpe(args)
        return None if bpe is None else PiecesOrTextDecoder(bpe)
