"""Pruned RNN-T loss (Kuang et al., 2022, k2's algorithm) in plain PyTorch.

The full joiner lattice is ``B x T x (U+1) x V`` logits. The pruned loss never builds it:

1. **Simple loss.** A trivial additive joiner (``SimpleJoiner``: encoder and predictor projected to ``V`` and
   added, no activation) has the lattice log-probabilities
   ``am[t, v] + lm[u, v] - log sum_v' exp(am[t, v'] + lm[u, v'])``; the normaliser is a ``B x T x (U+1)`` matrix
   product of ``exp(am)`` and ``exp(lm)`` (shifted by their maxima), so only the blank's and the labels'
   log-probabilities are ever formed. Its RNN-T loss (the same float64 recursion as the exact backend) trains
   the trivial joiner and gives, by its gradient, the occupation probability of every lattice node.
2. **Pruning bounds.** For every frame, the ``S`` consecutive label positions ``[s_t, s_t + S)`` that hold the
   most occupation, made monotone in ``t`` with ``s_{t+1} - s_t <= S - 1`` (so that windows connect), starting
   at 0 and ending on the final node.
3. **Pruned loss.** The real joiner runs on those ``B x T x S`` nodes only; their blank and label
   log-probabilities are placed into the ``B x T x (U+1)`` lattice (``-inf`` elsewhere) and the exact RNN-T
   recursion runs on it. With ``S >= U + 1`` nothing is pruned and the loss is the full RNN-T loss.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .rnnt_loss import LatticeLogProbs, _log_likelihood, drop_non_finite


class SimpleJoiner(nn.Module):
    """The trivial joiner of the simple loss: ``encoder -> V`` and ``predictor -> V`` projections, added.

    Args:
        encoder_dim, predictor_dim: widths of the encoder and predictor outputs.
        vocab_size: output units including blank.
    """

    def __init__(self, encoder_dim: int, predictor_dim: int, vocab_size: int):
        super().__init__()
        self.encoder_proj = nn.Linear(encoder_dim, vocab_size)
        self.predictor_proj = nn.Linear(predictor_dim, vocab_size)

    def forward(self, encoder_out: Tensor, predictor_out: Tensor) -> tuple[Tensor, Tensor]:
        """``B x T x De``, ``B x (U+1) x Dp`` -> ``am`` ``B x T x V`` and ``lm`` ``B x (U+1) x V``."""
        return self.encoder_proj(encoder_out), self.predictor_proj(predictor_out)


def simple_lattice(am: Tensor, lm: Tensor, targets: Tensor, blank: int) -> tuple[Tensor, Tensor]:
    """Lattice log-probabilities of the joiner ``logits[t, u] = am[t] + lm[u]``, never forming ``B x T x U1 x V``.

    Args:
        am: ``B x T x V``; lm: ``B x (U+1) x V``; targets: ``B x U`` labels; blank: the blank unit.

    Returns:
        blank ``B x T x (U+1)`` and label ``B x T x U`` log-probabilities, float32 (float64 for float64 input).
    """
    dtype = torch.float64 if am.dtype == torch.float64 else torch.float32
    am, lm = am.to(dtype), lm.to(dtype)
    am_max, lm_max = am.amax(-1, keepdim=True).detach(), lm.amax(-1, keepdim=True).detach()
    normaliser = torch.bmm((am - am_max).exp(), (lm - lm_max).exp().transpose(1, 2))  # B x T x U1
    normaliser = normaliser.clamp_min(torch.finfo(dtype).tiny).log() + am_max + lm_max.transpose(1, 2)
    blank_lp = am[..., blank, None] + lm[None, ..., blank].transpose(0, 1) - normaliser
    am_label = am.gather(2, targets[:, None, :].expand(-1, am.shape[1], -1))  # B x T x U
    lm_label = lm[:, :-1].gather(2, targets[:, :, None]).squeeze(2)  # B x U
    return blank_lp, am_label + lm_label[:, None, :] - normaliser[..., :-1]


def node_occupation(blank_lp: Tensor, label_lp: Tensor, logit_lengths: Tensor, target_lengths: Tensor) -> Tensor:
    """Posterior probability that an alignment leaves lattice node ``(t, u)``: ``B x T x (U+1)``, float64.

    It is minus the gradient of the RNN-T loss with respect to the log-probabilities of the node's blank and
    label arcs (the arcs' occupation), summed per node.
    """
    with torch.enable_grad():
        blank_lp, label_lp = blank_lp.detach().double().requires_grad_(), label_lp.detach().double().requires_grad_()
        log_likelihood = _log_likelihood(blank_lp, label_lp, logit_lengths, target_lengths)
        blank_grad, label_grad = torch.autograd.grad(log_likelihood.sum(), [blank_lp, label_lp])
    occupation = blank_grad.clone()
    occupation[:, :, :-1] += label_grad
    return occupation


def pruning_bounds(occupation: Tensor, logit_lengths: Tensor, target_lengths: Tensor, prune_range: int) -> Tensor:
    """Window starts ``s`` ``B x T`` (long): frame ``t`` keeps label positions ``[s_t, s_t + S)``.

    Each frame takes the window of ``S = prune_range`` positions with the most ``occupation``
    (``B x T x (U+1)``); then the starts are made monotone (lowered), connected (``s_{t+1} - s_t <= S - 1``,
    raised) and anchored at the lattice's corners (``s_0 = 0``; the last frame's window holds node ``U``).
    Windows never leave ``[0, U]`` (``U`` the padded label length).
    """
    B, T, U1 = occupation.shape
    S = min(prune_range, U1)
    cumulative = torch.nn.functional.pad(occupation.cumsum(-1), (1, 0))
    window_mass = cumulative[..., S:] - cumulative[..., :-S]  # B x T x (U1 - S + 1)
    starts = window_mass.argmax(-1)
    last_start = (target_lengths + 1 - S).clamp(min=0)[:, None]  # B x 1: the window that holds node U_b
    frames = torch.arange(T, device=starts.device)
    past_end = frames[None, :] >= (logit_lengths - 1)[:, None]
    starts = torch.where(past_end, last_start, starts.clamp(max=last_start))
    starts = starts.flip(1).cummin(1).values.flip(1)  # monotone: s_t = min_{j >= t} s_j
    slack = (S - 1) * frames[None, :]
    starts = (starts - slack).flip(1).cummax(1).values.flip(1) + slack  # connected: s_t >= s_j - (S-1)(j-t)
    return torch.minimum(starts, slack)  # s_0 = 0, and no frame is out of reach from the start


def pruned_lattice(
    joiner: nn.Module, encoder_proj: Tensor, predictor_proj: Tensor, targets: Tensor, starts: Tensor,
    prune_range: int, blank: int,
) -> tuple[Tensor, Tensor]:
    """The real joiner on the pruned nodes, placed into the lattice.

    Args:
        joiner: a :class:`~ssm_fairseq.asr.transducer.joiner.Joiner` (``step`` evaluates any nodes).
        encoder_proj: ``B x T x J`` and predictor_proj: ``B x (U+1) x J``, already projected by the joiner.
        targets: ``B x U`` labels. starts: ``B x T`` window starts (``pruning_bounds``).
        prune_range: ``S``. blank: the blank unit.

    Returns:
        blank ``B x T x (U+1)`` and label ``B x T x U`` log-probabilities, ``-inf`` outside the windows.
    """
    B, T, J = encoder_proj.shape
    U1 = predictor_proj.shape[1]
    S = min(prune_range, U1)
    positions = starts[:, :, None] + torch.arange(S, device=starts.device)  # B x T x S
    predictor_nodes = predictor_proj.gather(1, positions.reshape(B, T * S, 1).expand(-1, -1, J)).view(B, T, S, J)
    logits = joiner.step(encoder_proj[:, :, None], predictor_nodes)  # B x T x S x V: the only vocabulary tensor
    if U1 == 1:  # no labels in the batch
        blank_nodes = LatticeLogProbs.apply(logits, positions[:, :, :0], blank)[0]
        return blank_nodes, blank_nodes[:, :, :0]
    labels = targets.gather(1, positions.clamp(max=U1 - 2).reshape(B, T * S)).view(B, T, S)
    # the label of the node at position U is a placeholder, cut below
    blank_nodes, label_nodes = LatticeLogProbs.apply(logits, labels, blank)
    outside = blank_nodes.new_full((B, T, U1), -torch.inf)
    return outside.scatter(2, positions, blank_nodes), outside.scatter(2, positions, label_nodes)[:, :, :-1]


def pruned_rnnt_losses(
    joiner: nn.Module, simple_joiner: SimpleJoiner, encoder_out: Tensor, predictor_out: Tensor, targets: Tensor,
    logit_lengths: Tensor, target_lengths: Tensor, blank: int, prune_range: int = 5,
) -> tuple[Tensor, Tensor]:
    """Per-utterance simple and pruned RNN-T losses ``-log P(y|x)`` (``B`` each, float32; float64 for float64).

    Args:
        joiner: the real joiner; simple_joiner: the trivial one (trained by the simple loss).
        encoder_out: ``B x T x De``; predictor_out: ``B x (U+1) x Dp``; targets: ``B x U``.
        logit_lengths, target_lengths: ``B`` frames and labels per utterance (frames >= 1).
        blank: the blank unit. prune_range: ``S``, label positions kept per frame (>= 2).

    An utterance that needs more than ``S - 1`` labels in some frame of every alignment the bounds allow gets an
    infinite pruned loss (a caller drops it, as it drops any non-finite loss).
    """
    if prune_range < 2:
        raise ValueError(f"prune_range must be >= 2 (a frame keeps a node and its successor), got {prune_range}")
    dtype = torch.float64 if encoder_out.dtype == torch.float64 else torch.float32
    am, lm = simple_joiner(encoder_out, predictor_out)
    simple_blank, simple_label = simple_lattice(am, lm, targets, blank)
    simple = -_log_likelihood(simple_blank, simple_label, logit_lengths, target_lengths)
    occupation = node_occupation(simple_blank, simple_label, logit_lengths, target_lengths)
    starts = pruning_bounds(occupation, logit_lengths, target_lengths, prune_range)
    encoder_proj, predictor_proj = joiner.project(encoder_out, predictor_out)
    blank_lp, label_lp = pruned_lattice(joiner, encoder_proj, predictor_proj, targets, starts, prune_range, blank)
    pruned = -_log_likelihood(blank_lp, label_lp, logit_lengths, target_lengths)
    # the windows are connected from node (0, 0); the last frame's window must hold the final node
    last_start = starts.gather(1, (logit_lengths - 1)[:, None]).squeeze(1)
    reachable = last_start + min(prune_range, predictor_out.shape[1]) - 1 >= target_lengths
    return simple.to(dtype), torch.where(reachable, pruned, torch.inf).to(dtype)


def pruned_transducer_loss(
    joiner: nn.Module, simple_joiner: SimpleJoiner, encoder_out: Tensor, predictor_out: Tensor, targets: Tensor,
    encoder_lengths: Tensor, target_lengths: Tensor, blank: int, prune_range: int = 5,
) -> tuple[Tensor, Tensor]:
    """``pruned_rnnt_losses`` of a batch, skipping utterances with no frame or a non-finite loss (as
    :func:`~ssm_fairseq.asr.transducer.rnnt_loss.transducer_loss` does).

    Returns:
        ``(losses, kept)``: ``B x 2`` losses (simple, pruned; 0 for dropped utterances) and ``B`` bools.
    """
    device = encoder_out.device
    targets, encoder_lengths, target_lengths = (x.to(device) for x in (targets, encoder_lengths, target_lengths))

    def losses_of(index: Tensor) -> Tensor:
        T, U = int(encoder_lengths[index].max()), int(target_lengths[index].max())
        simple, pruned = pruned_rnnt_losses(
            joiner, simple_joiner, encoder_out[index, :T], predictor_out[index, :U + 1], targets[index, :U],
            encoder_lengths[index], target_lengths[index], blank, prune_range)
        return torch.stack([simple, pruned], 1)

    dtype = torch.float64 if encoder_out.dtype == torch.float64 else torch.float32
    return drop_non_finite(losses_of, encoder_lengths >= 1, dtype, (2,))
