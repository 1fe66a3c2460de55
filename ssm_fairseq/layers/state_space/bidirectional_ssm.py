"""The bidirectional SSM block (MSSM paper Eq. 10)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...ssm.batched_kernels import ChunkedKernel, layer_kernels
from ...ssm.fft_conv import fft_size, two_way_fft_conv, two_way_spectra, two_way_spectrum
from ...ssm.inference_cache import caching, kept
from .multihead_ssm import MultiHeadSSM, chunk_layout

# the largest spectrum (both directions of one stage, ``2 x C x D x (n/2 + 1)`` complex) kept between forward passes in
# inference: 8 MiB keeps a width-512 stage's up to 384 frames (15 s at 40 ms), so that a long utterance does not hold
# twice its kernels' memory in spectra
KEPT_SPECTRUM_BYTES = 8 * 2**20


class BidirectionalSSM(nn.Module):
    """``Linear(Cat[MSSM(x), Rev(MSSM(Rev(x)))])``: ``B x L x D -> B x L x D``.

    Two independent stacked multi-head SSMs, one causal and one anti-causal, each without its last Linear
    (their activations are the ``Act`` of Eq. 10), concatenated and projected from ``2D`` back to ``D``. On a
    GPU the kernels of both directions are generated in one call (``ssm.batched_kernels``). Each stage of both
    directions is one convolution (``two_way_fft_conv``: one FFT pair over the ``2D`` channels), except where a
    direction runs its own way (kernels convolved chunk by chunk, or stages recomputed: at document lengths on a
    CPU). The directions keep their own modules and parameters: they are merged at compute time only.
    Arguments as in ``MultiHeadSSM``. With ``kernel="s4", heads=1, stack=1`` this is the S4-LegS baseline block.
    """

    def __init__(self, dim: int, **mssm_args):
        super().__init__()
        self.forward_ssm = MultiHeadSSM(dim, reverse=False, output_linear=False, **mssm_args)
        self.backward_ssm = MultiHeadSSM(dim, reverse=True, output_linear=False, **mssm_args)
        self.out_proj = nn.Linear(2 * dim, dim)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``padding_mask``: ``B x L``, True at padded frames."""
        stages = len(self.forward_ssm.kernels)
        kernels = layer_kernels([*self.forward_ssm.kernels, *self.backward_ssm.kernels], x.shape[1], x.shape[0])
        forward_kernels, backward_kernels = kernels[:stages], kernels[stages:]
        chunked = [isinstance(k, ChunkedKernel) for k in kernels]
        if all(chunked) and not torch.is_grad_enabled():
            return self._chunked_both_ways(x, padding_mask, forward_kernels, backward_kernels)
        if self.forward_ssm.recomputes(x.shape[1]) or any(chunked):
            y = torch.cat([self.forward_ssm(x, padding_mask, forward_kernels),
                           self.backward_ssm(x, padding_mask, backward_kernels)], dim=-1)
        else:
            y = self._both_ways(x, padding_mask, forward_kernels, backward_kernels)
        return self.out_proj(y)

    def _both_ways(self, x: Tensor, padding_mask: Tensor | None, forward_kernels: list,
                   backward_kernels: list) -> Tensor:
        """Both directions' stages as one stack on ``B x 2D x L`` (direction-major channels): ``B x L x D`` ->
        ``B x L x 2D`` (the two directions' activations side by side).

        Each stage is one convolution (``two_way_fft_conv``), one activation and one dropout over both directions
        (they have the same gating and ``p``), and one batched product for the two directions' Linears (their
        weights stacked at compute time); the kernels' spectra of all stages are one FFT (``two_way_spectra``). In
        inference the stacked weights and each stage's spectrum (up to ``KEPT_SPECTRUM_BYTES``) are kept until a
        parameter changes (``ssm.inference_cache``)."""
        directions = (self.forward_ssm, self.backward_ssm)
        B, L, D = x.shape
        x = x.transpose(1, 2)
        if self.forward_ssm.in_proj is None:
            h = torch.cat([x, x], dim=1)
        else:  # both projections in one product: B x 2D x L
            weight, bias = kept(self, "in_proj", self._in_proj_parameters(), self._stacked_in_proj)
            h = torch.baddbmm(bias, weight.expand(B, -1, -1), x)
        for i, convolution in enumerate(self._stage_convolutions(forward_kernels, backward_kernels, L, h.dtype)):
            y = two_way_fft_conv(h, padding_mask=padding_mask, **convolution)  # B x 2 x C x D x L
            h = self.forward_ssm.activated(y.flatten(0, 1))  # 2B x D x L
            if i < len(self.forward_ssm.linears):
                linears = [ssm.linears[i] for ssm in directions]
                weight, bias = kept(self, f"linears {i}", [t for lin in linears for t in (lin.weight, lin.bias)],
                                    lambda: _stacked_linears(linears))
                h = _two_linears(weight, bias, h)
            h = h.view(B, 2 * D, L)
        return h.transpose(1, 2)

    def _chunked_both_ways(self, x: Tensor, padding_mask: Tensor | None, forward_kernels: list,
                           backward_kernels: list) -> Tensor:
        """The block in inference convolved chunk by chunk (``MultiHeadSSM.chunked_stages``), channels first from the
        projections to the output Linear: ``B x L x D`` -> ``B x L x D``.

        Each direction's projection is one product ``W x^T + b`` giving its ``D x (B L')`` inputs (``L'`` whole chunks),
        made just before its stages (two products of ``D`` rows rather than one of ``2D``: at the recipe's batch no
        temporary exceeds the 32 MiB above which glibc maps each allocation afresh), and the output Linear is two
        products of its halves with the directions' ``D x (B L')`` activations, positions first: nothing is
        transposed, concatenated or masked out of place."""
        B, L, D = x.shape
        rows, keep = chunk_layout(x, padding_mask, forward_kernels[0].chunk)
        forward, backward = [ssm.chunked_stages(ssm.chunked_input(rows, keep, B), keep, kernels).view(D, -1)
                             for ssm, kernels in ((self.forward_ssm, forward_kernels),
                                                  (self.backward_ssm, backward_kernels))]
        weight = self.out_proj.weight
        y = torch.addmm(self.out_proj.bias, forward.t(), weight[:, :D].t())
        return y.addmm_(backward.t(), weight[:, D:].t()).view(B, -1, D)[:, :L]

    def _in_proj_parameters(self) -> list[Tensor]:
        return [t for ssm in (self.forward_ssm, self.backward_ssm) for t in (ssm.in_proj.weight, ssm.in_proj.bias)]

    def _stacked_in_proj(self) -> tuple[Tensor, Tensor]:
        """Both directions' projections as one: weight ``2D x D``, bias ``2D x 1``."""
        directions = (self.forward_ssm, self.backward_ssm)
        return (torch.cat([ssm.in_proj.weight for ssm in directions]),
                torch.cat([ssm.in_proj.bias for ssm in directions]).unsqueeze(-1))

    def _stage_convolutions(self, forward_kernels: list, backward_kernels: list, L: int,
                            dtype: torch.dtype) -> list[dict]:
        """Each stage's kernels as ``two_way_fft_conv`` takes them: in inference the kept spectrum (``spectrum``), or
        the kernels themselves where it is too large to keep (transformed in their stage, one at a time); otherwise
        (training) all stages' spectra from one FFT (``shared_spectrum``)."""
        stages = list(zip(forward_kernels, backward_kernels))
        if caching(self):
            kept_spectra = [self._kept_spectrum(i, kernels, L, dtype) for i, kernels in enumerate(stages)]
            return [{"spectrum": spectrum} if spectrum is not None else dict(zip(("causal", "anticausal"), kernels))
                    for spectrum, kernels in zip(kept_spectra, stages)]
        return [{"shared_spectrum": spectrum} for spectrum in two_way_spectra(stages, L, dtype).unbind(0)]

    def _kept_spectrum(self, stage: int, kernels: tuple, L: int, dtype: torch.dtype) -> Tensor | None:
        """Stage ``stage``'s ``two_way_spectrum`` at length ``L``, kept while the stage's kernels are unchanged (and
        the length the same), or None where it would exceed ``KEPT_SPECTRUM_BYTES``."""
        n = fft_size(2 * L - 1)
        K = kernels[0][0]
        if 2 * K.shape[0] * K.shape[1] * (n // 2 + 1) * 2 * K.element_size() > KEPT_SPECTRUM_BYTES:
            return None
        stage_kernels = (self.forward_ssm.kernels[stage], self.backward_ssm.kernels[stage])
        tensors = [t for kernel in stage_kernels for t in (*kernel.parameters(), *kernel.buffers())]
        return kept(self, f"spectrum {stage}", tensors, lambda: two_way_spectrum(*kernels, L, dtype), (L, dtype))


def _stacked_linears(linears: list[nn.Linear]) -> tuple[Tensor, Tensor]:
    """Two Linears' weights and biases stacked: ``2 x D_out x D_in`` and ``2 x D_out x 1``."""
    weight = torch.stack([linear.weight for linear in linears])
    return weight, torch.stack([linear.bias for linear in linears]).unsqueeze(-1)


def _two_linears(weight: Tensor, bias: Tensor, x: Tensor) -> Tensor:
    """Linear ``d`` (``weight[d]``, ``bias[d]`` of ``_stacked_linears``) applied to ``x[2 b + d]`` (``2B x D_in x
    L``, channels first): ``2B x D_out x L``, in one batched product (the weights repeated for each ``b`` where
    ``B > 1``)."""
    batch = x.shape[0] // 2
    return torch.baddbmm(bias.expand(batch, -1, -1, -1).flatten(0, 1), weight.expand(batch, -1, -1, -1).flatten(0, 1), x)
