"""RNN-T loss (Graves 2012) over the ``B x T x (U+1) x V`` joiner lattice, and the joiner + loss of a batch.

Two backends compute the same negative log-likelihood ``-log P(y|x)``, summed over all alignments:

* ``torchaudio``: ``torchaudio.functional.rnnt_loss`` with the fused log-softmax (float32 and float16);
* ``pytorch``: exact and always available. A custom autograd function gathers the blank and label
  log-probabilities of each lattice node without a second ``B x T x (U+1) x V`` tensor, and the forward
  (alpha) recursion runs in float64 on the small ``B x T x (U+1)`` lattice, one frame at a time: within a frame
  the recursion over ``u`` is a log-space linear recurrence, solved at once by a cumulative sum and
  ``torch.logcumsumexp``.

``transducer_loss`` joins encoder and predictor outputs and computes the loss, optionally in sub-batches to
bound the lattice's peak memory, and drops utterances whose loss is not finite.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

BACKENDS = ("auto", "torchaudio", "pytorch")

# Lattice log-probabilities are raised to this floor before the recursion, so that -inf logits never meet
# inf - inf. A path through a floored node weighs at most e^-10000 (0 in float64), so finite logits give
# exact losses; a lattice whose every path has a -inf logit gets a loss above 1e4 instead of inf.
LOG_PROB_FLOOR = -1e4

# Elements per frame chunk of the vocabulary-sized temporaries (logsumexp, float32 work for float16 logits).
_CHUNK_ELEMENTS = 1 << 22


@functools.lru_cache(maxsize=None)
def torchaudio_rnnt_available() -> bool:
    """Whether ``torchaudio.functional.rnnt_loss`` imports (a torchaudio built for another torch raises)."""
    try:
        from torchaudio.functional import rnnt_loss  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def _frame_chunks(logits: Tensor) -> list[slice]:
    """Slices over the frames of ``B x T x U1 x V`` logits, each of at most about ``_CHUNK_ELEMENTS``."""
    B, T, U1, V = logits.shape
    step = max(1, _CHUNK_ELEMENTS // max(1, B * U1 * V))
    return [slice(start, start + step) for start in range(0, T, step)]


class LatticeLogProbs(torch.autograd.Function):
    """Blank and label log-softmax values of lattice nodes, without a second vocabulary-sized tensor.

    ``logits`` ``B x T x N x V`` (``N`` nodes per frame) and ``labels`` ``B x T x K`` (the label of each of the
    first ``K <= N`` nodes; an expanded view of ``B x K`` targets for the full lattice) -> blank ``B x T x N`` and
    label ``B x T x K`` log-probabilities, float32 (float64 for float64 logits). Only the logits and their
    log-normalisers are kept for backward, which writes the gradient into one logits-sized tensor.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, blank: int) -> tuple[Tensor, Tensor]:
        K = labels.shape[2]
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        lse = torch.cat([logits[:, frames].to(dtype).logsumexp(-1) for frames in _frame_chunks(logits)], dim=1)
        blank_lp = logits[..., blank].to(dtype) - lse
        label_lp = logits[:, :, :K].gather(-1, labels[..., None]).squeeze(-1).to(dtype) - lse[:, :, :K]
        ctx.blank = blank
        ctx.save_for_backward(logits, labels, lse)
        return blank_lp, label_lp

    @staticmethod
    @once_differentiable
    def backward(ctx, g_blank: Tensor, g_label: Tensor) -> tuple[Tensor, None, None]:
        """``grad = softmax(logits) * -(g_blank + g_label) + g_blank at blank + g_label at the label``."""
        logits, labels, lse = ctx.saved_tensors
        K = labels.shape[2]
        g_blank, g_label = g_blank.to(lse.dtype), g_label.to(lse.dtype)
        g_total = g_blank.clone()
        g_total[:, :, :K] += g_label
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        for frames in _frame_chunks(logits):
            out = grad[:, frames]
            work = out if out.dtype == lse.dtype else torch.empty(out.shape, dtype=lse.dtype, device=out.device)
            torch.sub(logits[:, frames], lse[:, frames, :, None], out=work).exp_()
            work.mul_(g_total[:, frames, :, None].neg())
            work[..., ctx.blank].add_(g_blank[:, frames])
            work[:, :, :K].scatter_add_(-1, labels[:, frames, :, None], g_label[:, frames, :, None])
            if work is not out:
                out.copy_(work)
        return grad, None, None


def _log_likelihood(blank_lp: Tensor, label_lp: Tensor, logit_lengths: Tensor, target_lengths: Tensor) -> Tensor:
    """``log P(y|x)``, ``B``, in float64 from blank ``B x T x (U+1)`` and label ``B x T x U`` log-probabilities.

    ``alpha[t, u] = logaddexp(alpha[t-1, u] + blank[t-1, u], alpha[t, u-1] + label[t, u-1])``; with the prefix
    sums ``S[t, u] = sum_{j<u} label[t, j]`` a frame is ``alpha[t] = S[t] + logcumsumexp(c - S[t])``, where
    ``c = alpha[t-1] + blank[t-1]``. Log-probabilities outside each utterance's lengths are replaced by 0, so
    they stay finite and get exactly zero gradient.
    """
    B, T, U1 = blank_lp.shape
    frames = (torch.arange(T, device=blank_lp.device) < logit_lengths[:, None])[:, :, None]  # B x T x 1
    nodes = (torch.arange(U1, device=blank_lp.device) <= target_lengths[:, None])[:, None, :]  # B x 1 x U1
    blank_lp = torch.where(frames & nodes, blank_lp.double().clamp_min(LOG_PROB_FLOOR), 0.0)
    label_lp = torch.where(frames & nodes[:, :, 1:], label_lp.double().clamp_min(LOG_PROB_FLOOR), 0.0)
    prefix = torch.cat([label_lp.new_zeros(B, T, 1), label_lp.cumsum(-1)], dim=-1)
    # unbind, not indexing per frame: its backward stacks the frame gradients once instead of T full-size ones
    prefixes, blanks = prefix.unbind(1), blank_lp.unbind(1)
    alphas = [prefixes[0]]
    for t in range(1, T):
        alphas.append(prefixes[t] + torch.logcumsumexp(alphas[-1] + blanks[t - 1] - prefixes[t], dim=-1))
    alpha = torch.stack(alphas, dim=1)
    batch, last = torch.arange(B, device=alpha.device), logit_lengths - 1
    return alpha[batch, last, target_lengths] + blank_lp[batch, last, target_lengths]


def _check_inputs(logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor, blank: int,
                  backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"RNN-T backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torchaudio" and not torchaudio_rnnt_available():
        raise ValueError("RNN-T backend 'torchaudio' requested but torchaudio.functional.rnnt_loss does not import; "
                         "use backend='pytorch' or 'auto'")
    if logits.dim() != 4 or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating B x T x (U+1) x V tensor, got {logits.dtype} of shape "
                         f"{tuple(logits.shape)}")
    B, T, U1, V = logits.shape
    if targets.shape != (B, U1 - 1) or targets.is_floating_point():
        raise ValueError(f"targets must be integer B x U = {B} x {U1 - 1} for logits of shape {tuple(logits.shape)}, "
                         f"got {targets.dtype} of shape {tuple(targets.shape)}")
    for name, lengths in (("logit_lengths", logit_lengths), ("target_lengths", target_lengths)):
        if lengths.shape != (B,) or lengths.is_floating_point():
            raise ValueError(f"{name} must be an integer tensor of shape ({B},), got {lengths.dtype} of shape "
                             f"{tuple(lengths.shape)}")
    if backend == "torchaudio" and logits.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"RNN-T backend 'torchaudio' takes float32 or float16 logits, got {logits.dtype}")
    if not 0 <= blank < V:
        raise ValueError(f"blank index {blank} is out of range for a vocabulary of {V}")
    if B == 0:
        return
    if logit_lengths.min() < 1 or logit_lengths.max() > T:
        raise ValueError(f"logit_lengths must lie in [1, T = {T}], got {logit_lengths.tolist()}")
    if target_lengths.min() < 0 or target_lengths.max() > U1 - 1:
        raise ValueError(f"target_lengths must lie in [0, U = {U1 - 1}], got {target_lengths.tolist()}")
    if targets.numel() and (targets.min() < 0 or targets.max() >= V):
        raise ValueError(f"targets must lie in [0, V = {V}), got values in [{targets.min()}, {targets.max()}]")


def rnnt_loss(logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor, blank: int,
              backend: str = "auto") -> Tensor:
    """Per-utterance RNN-T negative log-likelihood ``-log P(y|x)`` summed over all alignments.

    Args:
        logits: ``B x T x (U+1) x V`` raw (unnormalised) joiner outputs, any float dtype.
        targets: ``B x U`` integer labels; padding beyond ``target_lengths`` may hold any index in ``[0, V)``.
        logit_lengths: ``B`` frames per utterance, in ``[1, T]``.
        target_lengths: ``B`` labels per utterance, in ``[0, U]``.
        blank: index of the blank unit.
        backend: ``torchaudio``, ``pytorch`` or ``auto`` (torchaudio for float32 and float16 logits when it
            imports, else pytorch).

    Returns:
        ``B`` losses, float32 (float64 for float64 logits). Gradients at padded frames and labels are zero.
    """
    _check_inputs(logits, targets, logit_lengths, target_lengths, blank, backend)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if backend == "auto":
        use_torchaudio = logits.dtype in (torch.float32, torch.float16) and torchaudio_rnnt_available()
        backend = "torchaudio" if use_torchaudio else "pytorch"
    logit_lengths, target_lengths = logit_lengths.to(logits.device), target_lengths.to(logits.device)
    if logits.size(0) == 0:
        return logits.new_zeros(0, dtype=dtype)
    if backend == "pytorch":
        labels = targets.long()[:, None, :].expand(-1, logits.shape[1], -1)
        blank_lp, label_lp = LatticeLogProbs.apply(logits, labels, blank)
        return -_log_likelihood(blank_lp, label_lp, logit_lengths.long(), target_lengths.long()).to(dtype)
    from torchaudio.functional import rnnt_loss as torchaudio_rnnt_loss

    # torchaudio wants the lattice trimmed to the longest utterance and label sequence, and contiguous
    T, U = int(logit_lengths.max()), int(target_lengths.max())
    logits = logits[:, :T, :U + 1].contiguous()
    losses = torchaudio_rnnt_loss(logits, targets[:, :U].int(), logit_lengths.int(), target_lengths.int(),
                                  blank=blank, clamp=-1, reduction="none", fused_log_softmax=True)
    return losses.to(dtype)


class _Labels(NamedTuple):
    """What the joiner's lattice of a batch is scored against: ``B x U`` labels, ``B`` frames and ``B`` labels per
    utterance, the blank unit and the ``rnnt_loss`` backend."""

    targets: Tensor
    encoder_lengths: Tensor
    target_lengths: Tensor
    blank: int
    backend: str

    def rows(self, index: Tensor | slice) -> _Labels:
        """The labels of the utterances at ``index``."""
        return self._replace(targets=self.targets[index], encoder_lengths=self.encoder_lengths[index],
                             target_lengths=self.target_lengths[index])


def _joint_losses(joiner: nn.Module, encoder_proj: Tensor, predictor_proj: Tensor, labels: _Labels) -> Tensor:
    """Join projected ``B x T x J`` and ``B x (U+1) x J``, trimmed to the longest utterance, -> losses ``B``."""
    T, U = int(labels.encoder_lengths.max()), int(labels.target_lengths.max())
    logits = joiner.join(encoder_proj[:, :T], predictor_proj[:, :U + 1])
    return rnnt_loss(logits, labels.targets[:, :U], labels.encoder_lengths, labels.target_lengths, labels.blank,
                     labels.backend)


def _sub_batched(joiner: nn.Module, encoder_proj: Tensor, predictor_proj: Tensor, labels: _Labels,
                 sub_batch_size: int) -> Tensor:
    """Losses ``B``, one lattice of ``sub_batch_size`` utterances at a time.

    Under autograd, each sub-batch's gradients with respect to its projected rows and the joiner's output
    parameters are taken at once, its lattice is freed, and the gradients are attached to the losses as
    ``value + surrogate - surrogate.detach()``, with ``surrogate = sum(x * grad_x)``. The projected rows'
    surrogate is per utterance (exact for any weighting of the losses); the output parameters' surrogate is
    added to the first loss, so their gradient is exact for ``losses.sum()`` and its multiples (fp16 loss
    scaling; the sub-batch gradients themselves are taken unscaled, in the model's dtype). If some loss is not
    finite, the values come back without gradients.
    """
    params = [p for p in joiner.output.parameters() if p.requires_grad]
    track = torch.is_grad_enabled() and (encoder_proj.requires_grad or predictor_proj.requires_grad or bool(params))
    if track:
        g_encoder, g_predictor = torch.zeros_like(encoder_proj), torch.zeros_like(predictor_proj)
        g_params = [torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32)) for p in params]
    values, finite = [], True
    for start in range(0, encoder_proj.size(0), sub_batch_size):
        rows = slice(start, start + sub_batch_size)
        encoder_rows, predictor_rows = encoder_proj[rows], predictor_proj[rows]
        if track:  # leaves, so that the gradient stops at the projected rows
            encoder_rows = encoder_rows.detach().requires_grad_()
            predictor_rows = predictor_rows.detach().requires_grad_()
        losses = _joint_losses(joiner, encoder_rows, predictor_rows, labels.rows(rows))
        values.append(losses.detach())
        finite = finite and bool(torch.isfinite(losses).all())
        if track and finite:
            grads = torch.autograd.grad(losses.sum(), [encoder_rows, predictor_rows, *params])
            g_encoder[rows], g_predictor[rows] = grads[0], grads[1]
            for total, grad in zip(g_params, grads[2:]):
                total += grad
        del losses
    values = torch.cat(values)
    if not (track and finite):
        return values
    surrogate = ((encoder_proj * g_encoder).flatten(1).sum(1, dtype=values.dtype)
                 + (predictor_proj * g_predictor).flatten(1).sum(1, dtype=values.dtype))
    surrogate[0] += sum((p * g).sum() for p, g in zip(params, g_params))
    return values + surrogate - surrogate.detach()


def transducer_loss(joiner: nn.Module, encoder_out: Tensor, predictor_out: Tensor, targets: Tensor,
                    encoder_lengths: Tensor, target_lengths: Tensor, blank: int, backend: str = "auto",
                    sub_batch_size: int = 0) -> tuple[Tensor, Tensor]:
    """Joiner and RNN-T loss of a batch, skipping utterances that have no frame or a non-finite loss.

    Utterances with ``encoder_lengths < 1`` are dropped up front; those whose loss is not finite are dropped and
    the loss is recomputed without them (projection included, so that a NaN encoder output cannot reach any
    gradient): a non-finite utterance never reaches ``backward``.

    With ``sub_batch_size > 0`` the lattice is built for that many utterances at a time, each sub-batch trimmed
    to its own longest utterance. Under autograd each sub-batch's gradients are taken and its lattice freed at
    once; the caller's single ``losses.sum().backward()`` then gives the same gradients as ``sub_batch_size=0``
    (see ``_sub_batched``).

    Args:
        joiner: a :class:`~ssm_fairseq.asr.transducer.joiner.Joiner` (``project``, ``join`` and ``output``).
        encoder_out: ``B x T x De``.
        predictor_out: ``B x (U+1) x Dp``.
        targets: ``B x U`` labels.
        encoder_lengths: ``B`` frames per utterance.
        target_lengths: ``B`` labels per utterance.
        blank: index of the blank unit.
        backend: see :func:`rnnt_loss`.
        sub_batch_size: utterances per lattice; 0 for the whole batch at once.

    Returns:
        ``(losses, kept)``: ``B`` losses (float32, float64 for float64 inputs; 0 for dropped utterances) and
        ``B`` bools. When no utterance is kept, the losses are constant zeros outside the autograd graph.
    """
    B, device = encoder_out.size(0), encoder_out.device
    if predictor_out.size(0) != B or targets.size(0) != B or predictor_out.size(1) != targets.size(1) + 1:
        raise ValueError(f"encoder_out B x T x De, predictor_out B x (U+1) x Dp and targets B x U must agree, got "
                         f"{tuple(encoder_out.shape)}, {tuple(predictor_out.shape)} and {tuple(targets.shape)}")
    if sub_batch_size < 0:
        raise ValueError(f"sub_batch_size must be >= 0, got {sub_batch_size}")
    targets, encoder_lengths, target_lengths = (x.to(device) for x in (targets, encoder_lengths, target_lengths))
    labels = _Labels(targets, encoder_lengths, target_lengths, blank, backend)

    def losses_of(index: Tensor) -> Tensor:
        encoder_proj, predictor_proj = joiner.project(encoder_out[index], predictor_out[index])
        if sub_batch_size == 0:
            return _joint_losses(joiner, encoder_proj, predictor_proj, labels.rows(index))
        return _sub_batched(joiner, encoder_proj, predictor_proj, labels.rows(index), sub_batch_size)

    dtype = torch.float64 if encoder_out.dtype == torch.float64 else torch.float32
    return drop_non_finite(losses_of, encoder_lengths >= 1, dtype)


def drop_non_finite(
    losses_of: Callable[[Tensor], Tensor], kept: Tensor, dtype: torch.dtype, row_shape: tuple[int, ...] = ()
) -> tuple[Tensor, Tensor]:
    """Losses of the ``kept`` utterances, recomputed without any utterance whose loss is not finite.

    Args:
        losses_of: utterance indices ``N`` -> their losses ``N x row_shape`` (one row per utterance), computed
            from the inputs (projections included), so that a dropped utterance reaches no gradient.
        kept: ``B`` bools, the utterances to score; updated in place.
        dtype, row_shape: of the all-zero losses returned when no utterance is kept.

    Returns:
        ``(losses, kept)``: ``B x row_shape`` losses, 0 for dropped utterances, and ``kept``. When no utterance is
        kept, the losses are constant zeros outside the autograd graph.
    """
    while kept.any():
        index = kept.nonzero().squeeze(1)
        values = losses_of(index)
        finite = torch.isfinite(values).reshape(len(index), -1).all(1)
        if finite.all():
            return values.new_zeros((kept.numel(), *values.shape[1:])).index_copy(0, index, values), kept
        kept[index[~finite]] = False
        del values
    return torch.zeros((kept.numel(), *row_shape), dtype=dtype, device=kept.device), kept
