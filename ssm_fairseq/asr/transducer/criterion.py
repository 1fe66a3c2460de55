"""The ``transducer`` criterion: RNN-T loss (full or pruned), optional auxiliary CTC, fairseq logging.

``--rnnt-loss pruned`` trains with the pruned RNN-T loss (``asr/transducer/pruned_rnnt_loss.py``): the criterion owns
the
trivial joiner of the simple loss (saved in checkpoints with the criterion's state, not needed for decoding), and
combines ``simple_scale * simple + pruned_scale * pruned`` with icefall's warm-up: over the first
``--prune-warmup-updates`` updates the simple loss's scale falls linearly from 1 to ``--simple-loss-scale`` and the
pruned loss's rises from 0.1 to 1.

Utterances that cannot be scored (features with NaN or inf, encoder output shorter than one frame, non-finite
loss) are counted in ``dropped``, logged by sample id and left out of the step; they never turn into a NaN update.
Non-finite features are found before the forward pass and zeroed: a NaN input would poison the weight gradients
even with its loss excluded (``0 * NaN``).
"""

import itertools
import logging
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II
from torch import Tensor

from .pruned_rnnt_loss import SimpleJoiner, pruned_transducer_loss
from .rnnt_loss import transducer_loss
from ...integrity.feature_check import non_finite_utterances

logger = logging.getLogger(__name__)


@dataclass
class TransducerCriterionConfig(FairseqDataclass):
    """Options of ``--criterion transducer`` (one field per command-line flag, ``--rnnt-backend`` ...)."""

    rnnt_backend: ChoiceEnum(["auto", "torchaudio", "pytorch"]) = field(
        default="auto", metadata={"help": "auto: torchaudio's fused rnnt_loss when it imports, else exact PyTorch"}
    )
    joint_sub_batch: int = field(
        default=0,
        metadata={"help": "compute joiner + loss this many utterances at a time to bound peak memory; 0: all"},
    )
    aux_ctc_weight: float = field(
        default=0.3, metadata={"help": "weight of the auxiliary CTC losses (models built with --aux-ctc-every)"}
    )
    rnnt_loss: ChoiceEnum(["full", "pruned"]) = field(
        default="full",
        metadata={"help": "full: the whole B x T x (U+1) x V lattice; pruned: k2's pruned RNN-T (simple loss, then "
                          "the joiner on --prune-range label positions per frame)"},
    )
    prune_range: int = field(default=5, metadata={"help": "pruned loss: label positions kept per frame (S)"})
    simple_loss_scale: float = field(
        default=0.5, metadata={"help": "pruned loss: weight of the simple loss after the warm-up"}
    )
    prune_warmup_updates: int = field(
        default=2000, metadata={"help": "pruned loss: updates over which the loss scales reach their final values"}
    )
    encoder_embed_dim: int = II("model.encoder_embed_dim")
    predictor_hidden_dim: int = II("model.predictor_hidden_dim")


def strip_eos(target: Tensor, lengths: Tensor, eos: int) -> tuple[Tensor, Tensor]:
    """fairseq targets end with eos: drop it (``B x U`` and ``B`` in, same out)."""
    has_eos = target.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1).eq(eos) & (lengths > 0)
    return target, lengths - has_eos.long()


@register_criterion("transducer", dataclass=TransducerCriterionConfig)
class TransducerCriterion(FairseqCriterion):
    """``--criterion transducer``: the RNN-T loss of a ``*_transducer`` model, summed over the batch.

    Main options: ``--rnnt-loss full|pruned`` (the whole lattice, or k2's pruned loss with ``--prune-range``,
    ``--simple-loss-scale``, ``--prune-warmup-updates``), ``--rnnt-backend auto|torchaudio|pytorch``,
    ``--joint-sub-batch N`` (joiner and loss N utterances at a time) and ``--aux-ctc-weight`` (models built with
    ``--aux-ctc-every``). Utterances that cannot be scored are dropped from the step and counted (module doc).
    """

    def __init__(self, cfg: TransducerCriterionConfig, task):
        super().__init__(task)
        self.backend, self.sub_batch, self.aux_weight = cfg.rnnt_backend, cfg.joint_sub_batch, cfg.aux_ctc_weight
        self.eos = task.target_dictionary.eos()
        self.simple_joiner = None
        if cfg.rnnt_loss == "pruned":
            if cfg.prune_range < 2:
                raise ValueError(f"--prune-range must be >= 2, got {cfg.prune_range}")
            self.simple_joiner = SimpleJoiner(cfg.encoder_embed_dim, cfg.predictor_hidden_dim,
                                              len(task.target_dictionary))
        self.prune_range, self.simple_loss_scale = cfg.prune_range, cfg.simple_loss_scale
        self.prune_warmup_updates, self.num_updates = cfg.prune_warmup_updates, 0

    def set_num_updates(self, num_updates: int) -> None:
        """Called by the ``speech_transducer`` task before each training step (the pruned loss's warm-up)."""
        self.num_updates = num_updates

    def loss_scales(self) -> tuple[float, float]:
        """``(simple, pruned)`` scales of the pruned loss at the current update (icefall's warm-up)."""
        progress = min(1.0, self.num_updates / self.prune_warmup_updates) if self.prune_warmup_updates > 0 else 1.0
        return 1.0 - progress * (1.0 - self.simple_loss_scale), 0.1 + 0.9 * progress

    def forward(self, model, sample, reduce: bool = True):
        net_input = sample["net_input"]
        features, feature_lengths = net_input["src_tokens"], net_input["src_lengths"]
        unreadable = non_finite_utterances(features, feature_lengths)
        if unreadable.any():  # zeroed so that the forward and backward stay finite; scored by no loss below
            features = features.masked_fill(unreadable[:, None, None], 0.0)
        targets, target_lengths = strip_eos(sample["target"], sample["target_lengths"], self.eos)
        encoder, predictor_out = model(features, feature_lengths, targets, target_lengths)
        # the losses drop an utterance with no encoder frame (and the auxiliary CTC scores only the kept ones)
        encoder_lengths = encoder["encoder_lengths"]
        encoder_lengths = encoder_lengths.masked_fill(unreadable.to(encoder_lengths.device), 0)
        loss, rnnt, simple, kept = self._rnnt_loss(model, encoder["encoder_out"], predictor_out, targets,
                                                   encoder_lengths, target_lengths)
        self._report_dropped(sample["id"], kept, encoder_lengths, unreadable)
        # every trainable parameter stays in the graph (zero gradient) whatever was dropped: fairseq's default
        # --ddp-backend pytorch_ddp fails the next update when a parameter got no gradient on some rank
        trainable = [p for p in itertools.chain(model.parameters(), self.parameters()) if p.requires_grad]
        loss = loss + 0.0 * sum(p.sum() for p in trainable)
        aux = self._aux_ctc(model, encoder, targets, target_lengths, kept)
        if aux is not None:
            loss = loss + self.aux_weight * aux
        n_kept = int(kept.sum())
        sample_size = int(target_lengths[kept].sum())
        logging_output = {
            "loss": loss.detach(),
            "rnnt_loss": rnnt.detach(),
            "aux_ctc_loss": aux.detach() if aux is not None else 0.0,
            "ntokens": sample_size,
            "nsentences": n_kept,
            "sample_size": sample_size,
            "dropped": len(kept) - n_kept,
        }
        if simple is not None:
            logging_output["simple_loss"] = simple.detach()
        return loss, sample_size, logging_output

    def _rnnt_loss(self, model, encoder_out: Tensor, predictor_out: Tensor, targets: Tensor, encoder_lengths: Tensor,
                   target_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """The batch's RNN-T loss -> ``(loss, rnnt, simple, kept)``: the full loss (``rnnt``, with ``simple`` None),
        or with ``--rnnt-loss pruned`` the pruned (``rnnt``) and simple losses weighted by ``loss_scales``; each
        summed over the ``B`` utterances ``kept`` (``transducer_loss``, ``pruned_transducer_loss``).

        ``encoder_out``: ``B x T x De``; ``predictor_out``: ``B x (U+1) x Dp``; ``targets``: ``B x U``.
        """
        if self.simple_joiner is None:
            losses, kept = transducer_loss(
                model.joiner, encoder_out, predictor_out, targets, encoder_lengths, target_lengths,
                model.blank, self.backend, self.sub_batch,
            )
            rnnt = losses.sum()
            return rnnt, rnnt, None, kept
        losses, kept = pruned_transducer_loss(
            model.joiner, self.simple_joiner, encoder_out, predictor_out, targets, encoder_lengths,
            target_lengths, model.blank, self.prune_range,
        )
        simple, rnnt = losses.sum(0)
        simple_scale, pruned_scale = self.loss_scales()
        return simple_scale * simple + pruned_scale * rnnt, rnnt, simple, kept

    @staticmethod
    def _report_dropped(ids: Tensor, kept: Tensor, encoder_lengths: Tensor, unreadable: Tensor) -> None:
        for i in (~kept).nonzero().flatten().tolist():
            if unreadable[i]:
                reason = "features are not finite (NaN or inf)"
            else:
                reason = "encoder output has no frames" if encoder_lengths[i] < 1 else "loss is not finite"
            logger.warning("dropped utterance id=%d from this step: %s", int(ids[i]), reason)

    def _aux_ctc(self, model, encoder: dict, targets: Tensor, target_lengths: Tensor, kept: Tensor) -> Tensor | None:
        """Mean over intermediate layers of the kept utterances' summed CTC losses.

        Only kept utterances enter CTC (a dropped one may hold NaN); CTC cannot align an utterance with fewer
        frames than labels plus repeats, so such an utterance adds zero (``zero_infinity``).
        """
        if model.aux_ctc is None or not encoder["intermediate"] or not kept.any():
            return None
        index = kept.nonzero().flatten()
        lengths, targets, target_lengths = encoder["encoder_lengths"][index], targets[index], target_lengths[index]
        layer_losses = []
        for hidden in encoder["intermediate"]:
            logits = model.aux_ctc(hidden.index_select(0, index)).float()
            log_probs = F.log_softmax(logits, dim=-1).transpose(0, 1)  # T x B' x V
            layer_losses.append(
                F.ctc_loss(log_probs, targets, lengths, target_lengths, blank=model.blank, reduction="sum",
                           zero_infinity=True)
            )
        return torch.stack(layer_losses).mean()

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        """Loss per target token in base 2, as fairseq reports it."""
        total = lambda key: sum(log.get(key, 0) for log in logging_outputs)  # noqa: E731
        sample_size = total("sample_size")
        denominator = max(sample_size, 1) * math.log(2)
        metrics.log_scalar("loss", total("loss") / denominator, sample_size, round=3)
        metrics.log_scalar("rnnt_loss", total("rnnt_loss") / denominator, sample_size, round=3)
        if any("simple_loss" in log for log in logging_outputs):
            metrics.log_scalar("simple_loss", total("simple_loss") / denominator, sample_size, round=3)
        metrics.log_scalar("aux_ctc_loss", total("aux_ctc_loss") / denominator, sample_size, round=3)
        metrics.log_scalar("dropped", total("dropped"), round=0)
        metrics.log_scalar("nsentences", total("nsentences"), round=0)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
