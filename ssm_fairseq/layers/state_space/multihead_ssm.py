"""The stacked multi-head SSM of one direction (MSSM paper sections 2.2, 3.2 and 3.3).

One stage is ``f(u) = Linear(Act(SSM(u)))`` (Eq. 6); ``stack`` stages with separate parameters are chained
(Fig. 1b). With ``heads > 1`` a ``Linear(D, D)`` projects the input first and its output is read as ``heads``
groups of ``D / heads`` channels, each group one tied SSM kernel (Fig. 2a). Later stages take the previous
stage's Linear output as their multi-head input, so the projection is paid once per direction.

``Act`` is one of:
  * ``ihg``: inter-head gating (Eq. 9), ``C = 2``: ``a^(h)_c = y^(h)_c * sigmoid(y^(h + H/2)_c)``, H even;
  * ``glu``: gating inside a channel (Eq. 8), ``C = 2``: ``a = y_1 * sigmoid(y_2)``;
  * ``gelu``: ``C = 1``.
Both gated forms return ``D`` channels; ``ihg`` keeps the ``H/2`` gated heads' two outputs each.

With ``output_linear=False`` the last stage stops after ``Act`` (the bidirectional block of Eq. 10 owns the
final Linear). ``reverse=True`` runs the SSM anti-causally, which equals ``Rev(SSM(Rev(x)))`` on each
sequence's own length: padding never reaches a real frame in either direction.

On a CPU, from ``RECOMPUTE_MIN_LENGTH`` positions, each stage's convolution and activation run again in the backward
pass (``recompute_stages``, ``recompute.recomputed``): autograd keeps the stage's ``B x L x D`` input only, not its
``B x C x D x L`` convolution output or the convolution's intermediates.

A causal (``reverse=False``) stack also runs chunk by chunk (``step``): each kernel's recurrence carries its
``B x D x N`` state from one chunk to the next, so a stream of any length costs the same per frame and gives the
outputs of ``forward`` over the whole stream.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...ssm import MSSMKernel, S4Kernel
from ...ssm.batched_kernels import ChunkedKernel, layer_kernels
from ...ssm.chunked_conv import RowWriter, chunk_convolution, convolve_batch_first, padded_length
from ...ssm.fft_conv import compute_dtype, fft_conv
from ..dropout import LeanDropout
from ..recompute import recomputed

GATINGS = {"ihg": 2, "glu": 2, "gelu": 1}  # gating -> output expansion C
# the shortest sequence whose stages are recomputed. Where memory matters, at document lengths, it is cheap: one MSSM
# masked-LM layer (width 1024) at 4k tokens, 3.1 -> 3.5 s, 730 -> 352 MiB on a 2-core CPU; at speech lengths it is
# not (a width-512 encoder layer at 250 frames, 71 -> 89 ms)
RECOMPUTE_MIN_LENGTH = 2048


def build_kernel(kernel: str, channels: int, out_channels: int, heads: int, state_size: int, **kwargs) -> nn.Module:
    """``mssm``: one tied MSSM kernel per head; ``s4``: one S4-LegS kernel shared by all channels (one head)."""
    if kernel == "mssm":
        return MSSMKernel(channels, state_size, out_channels, heads=heads, **kwargs)
    if kernel == "s4":
        if heads != 1:
            raise ValueError(f"the S4-LegS kernel is single-head, got heads={heads}")
        return S4Kernel(channels, state_size, out_channels, **kwargs)
    raise ValueError(f"kernel must be 'mssm' or 's4', got {kernel!r}")


def chunk_layout(x: Tensor, padding_mask: Tensor | None, chunk: int) -> tuple[Tensor, Tensor | None]:
    """``B x L x D`` inputs as the ``(B L') x D`` rows a chunked stack projects (``L'``: ``L`` rounded up to whole
    chunks, zero rows appended), and ``B x L'`` weights that zero the padded positions (None where there are none)."""
    B, L, D = x.shape
    padded = padded_length(L, chunk)
    if padded > L:
        x = F.pad(x, (0, 0, 0, padded - L))
    if padding_mask is None and padded == L:
        return x.reshape(B * padded, D), None
    keep = x.new_zeros(B, padded)
    keep[:, :L] = 1.0 if padding_mask is None else (~padding_mask).to(x.dtype)
    return x.reshape(B * padded, D), keep


def linear_channels_first(linear: nn.Linear, x: Tensor) -> Tensor:
    """``linear`` applied to ``B x D_in x L`` inputs: ``B x D_out x L`` (``W x + b``, no transposing copy), one
    batched product with the bias added in it (``baddbmm``; a ``matmul`` and an addition would be four operators)."""
    return torch.baddbmm(linear.bias.unsqueeze(-1), linear.weight.expand(x.shape[0], -1, -1), x)


class MultiHeadSSM(nn.Module):
    """Stacked multi-head SSM: ``B x L x D -> B x L x D``.

    Args:
        dim: ``D``.
        heads: ``H`` (``D`` must be a multiple; even for ``ihg``).
        stack: number of stages ``s``.
        gating: ``ihg``, ``glu`` or ``gelu``.
        state_size: state size of each kernel (``D_sh = 32`` for MSSM, 64 for S4).
        kernel: ``mssm`` or ``s4``; ``kernel_args`` go to its constructor (``scale``; ``l_max``).
        reverse: anti-causal direction.
        output_linear: keep the last stage's Linear.
        dropout: after each activation.
        recompute_stages: recompute each stage in the backward pass on a CPU (off where a caller recomputes the
            whole block, as SPADE's global branch does).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 1,
        stack: int = 1,
        gating: str = "gelu",
        state_size: int = 32,
        kernel: str = "mssm",
        reverse: bool = False,
        output_linear: bool = True,
        dropout: float = 0.0,
        recompute_stages: bool = True,
        **kernel_args,
    ):
        super().__init__()
        if gating not in GATINGS:
            raise ValueError(f"gating must be one of {sorted(GATINGS)}, got {gating!r}")
        if heads < 1:  # before dim % heads, which would divide by zero
            raise ValueError(f"the number of SSM heads (--ssm-heads) must be at least 1, got {heads}")
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
        if gating == "ihg" and heads % 2:
            raise ValueError(f"inter-head gating needs an even number of heads, got {heads}")
        if stack < 1:
            raise ValueError(f"stack must be at least 1, got {stack}")
        self.heads, self.gating, self.reverse, self.recompute_stages = heads, gating, reverse, recompute_stages
        self.in_proj = nn.Linear(dim, dim) if heads > 1 else None
        self.kernels = nn.ModuleList(
            build_kernel(kernel, dim, GATINGS[gating], heads, state_size, **kernel_args) for _ in range(stack)
        )
        n_linear = stack if output_linear else stack - 1
        self.linears = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_linear))
        self.dropout = LeanDropout(dropout)

    def activate(self, y: Tensor) -> Tensor:
        """``... x C x D x L`` SSM outputs (``B x C x D x L``; ``2B x C x D x L`` for both directions of a block)
        -> ``... x D x L``."""
        if self.gating == "gelu":
            return F.gelu(y.select(-3, 0))
        # F.glu keeps only its input for the backward pass (a product with a sigmoid would keep both factors)
        if self.gating == "glu":
            return F.glu(y, dim=-3).squeeze(-3)
        *batch, C, D, L = y.shape
        y = y.view(*batch, C, 2, D // 2, L)  # heads h < H/2 are gated by heads h + H/2
        return F.glu(y, dim=-3).reshape(*batch, D, L)

    def activated(self, y: Tensor) -> Tensor:
        """``Dropout(Act(y))`` of ``... x C x D x L`` SSM outputs: ``... x D x L``."""
        return self.dropout(self.activate(y))

    def _stage(self, x: Tensor, kernel: tuple[Tensor, Tensor] | ChunkedKernel, padding_mask: Tensor | None) -> Tensor:
        """``Dropout(Act(SSM(x)))`` of one stage: ``B x D x L -> B x D x L``."""
        if isinstance(kernel, ChunkedKernel):
            matrices = kernel.kernel.chunk_matrices(x.shape[-1], kernel.chunk, self.reverse, compute_dtype(x))
            return self.activated(convolve_batch_first(x, matrices, padding_mask, self.reverse))
        return self.activated(fft_conv(x, *kernel, padding_mask, reverse=self.reverse))

    def _chunked_stage(self, h: Tensor, kernel: ChunkedKernel) -> Tensor:
        """``Dropout(Act(SSM(h)))`` of one stage convolved chunk by chunk in inference: ``D x B x L'`` (padded
        positions zeroed) -> ``D x B x L'`` in ``h``'s dtype (computed in float32, or float64 for float64)."""
        dtype = compute_dtype(h)
        matrices = kernel.kernel.chunk_matrices(h.shape[-1], kernel.chunk, self.reverse, dtype)
        write_row = chunk_convolution(h.to(dtype), matrices, self.reverse)
        return self.dropout(self._activated_rows(write_row, h.new_empty(h.shape, dtype=dtype))).to(h.dtype)

    def _activated_rows(self, write_row: RowWriter, out: Tensor) -> Tensor:
        """``Act`` of SSM outputs written one output row ``c`` at a time by ``write_row(c, row)``
        (``chunk_convolution``), into ``out`` (``D x ...``, contiguous): what ``activate`` computes, in place, with at
        most one row beside ``out`` (``activate`` would take all ``C`` rows at once)."""
        if self.gating == "gelu":
            return torch.ops.aten.gelu_(write_row(0, out))
        row = torch.empty_like(out)
        if self.gating == "glu":  # y_0 * sigmoid(y_1)
            gate = write_row(1, row).sigmoid_()
            return write_row(0, out).mul_(gate)
        half = out.shape[0] // 2  # ihg: heads h < H/2 gated by heads h + H/2, in each row c
        for c in range(2):
            write_row(c, row)
            torch.mul(row[:half], row[half:].sigmoid_(), out=out[c * half:(c + 1) * half])
        return out

    def chunked_stages(self, h: Tensor, keep: Tensor | None, kernels: list[ChunkedKernel]) -> Tensor:
        """The stages in inference on channels-first inputs in whole chunks, convolved chunk by chunk
        (``chunk_convolution``): ``h``: ``D x B x L'`` (this stack's projection applied, padded positions zeroed) -> ``D
        x B x L'``, the last stage's activations (the output Linear, if kept, is the caller's). The Linears between
        stages run as ``W h + b`` on the ``D x (B L')`` matrix; ``keep`` (``chunk_layout``) zeroes the next stage's
        padded inputs. (In training a stack's stages run batch first, as with FFT convolutions: ``forward``.)"""
        D, B, padded = h.shape
        for i, kernel in enumerate(kernels):
            if i:
                linear = self.linears[i - 1]
                h = torch.addmm(linear.bias.unsqueeze(-1), linear.weight, h.view(D, -1))
                if keep is not None:  # in place on the product itself (on a view autograd would copy it back)
                    h.mul_(keep.view(-1))
                h = h.view(D, B, padded)
            h = self._chunked_stage(h, kernel)
        return h

    def chunked_input(self, rows: Tensor, keep: Tensor | None, batch: int) -> Tensor:
        """The first stage's inputs in inference, channels first: ``(B L') x D`` rows and their weights
        (``chunk_layout``) -> ``D x B x L'``, this stack's projection applied (``W x^T + b``) and padded positions
        zeroed."""
        if self.in_proj is None:
            h = rows.t().contiguous()
        else:
            h = torch.addmm(self.in_proj.bias.unsqueeze(-1), self.in_proj.weight, rows.t())
        if keep is not None:  # in place on the product itself (on a view autograd would copy it back)
            h.mul_(keep.view(-1))
        return h.view(h.shape[0], batch, -1)

    def _chunked_forward(self, x: Tensor, padding_mask: Tensor | None, kernels: list[ChunkedKernel]) -> Tensor:
        """``forward`` in inference convolved chunk by chunk, channels first from the projection to the output
        Linear."""
        B, L, D = x.shape
        rows, keep = chunk_layout(x, padding_mask, kernels[0].chunk)
        h = self.chunked_stages(self.chunked_input(rows, keep, B), keep, kernels).view(D, -1)
        if len(self.linears) == len(kernels):  # the output Linear, positions first: B x L' x D
            last = self.linears[-1]
            return torch.addmm(last.bias, h.t(), last.weight.t()).view(B, -1, D)[:, :L]
        return h.t().view(B, -1, D)[:, :L]

    def recomputes(self, L: int) -> bool:
        """Whether the stages of a length-``L`` forward pass are recomputed in the backward pass (on a CPU)."""
        return self.recompute_stages and L >= RECOMPUTE_MIN_LENGTH

    def projected(self, x: Tensor) -> Tensor:
        """The multi-head projection of ``B x D x L`` inputs (the identity with one head)."""
        return x if self.in_proj is None else linear_channels_first(self.in_proj, x)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, kernels: list | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``padding_mask``: ``B x L``, True at padded frames. Returns ``B x L x D``.

        ``kernels``: each stage's ``batched_kernels.layer_kernels`` result at length ``L`` if the caller has them
        (``BidirectionalSSM`` gets both directions' at once, in one call on a GPU); by default this stack gets its own.
        Inside, the stages run channels first (``B x D x L``, the linears between them as ``W x + b``), so that the
        convolutions read and write whole rows of positions without transposing copies.
        """
        L = x.shape[1]
        if kernels is None:
            kernels = layer_kernels(list(self.kernels), L, x.shape[0])
        if not torch.is_grad_enabled() and all(isinstance(kernel, ChunkedKernel) for kernel in kernels):
            return self._chunked_forward(x, padding_mask, kernels)
        x = self.projected(x.transpose(1, 2))
        for i, kernel in enumerate(kernels):
            if self.recomputes(L):
                x = recomputed(self._stage, x, kernel, padding_mask)  # on a CPU keeps only the stage's input
            else:
                x = self._stage(x, kernel, padding_mask)
            if i == len(self.linears) - 1 == len(kernels) - 1:  # the output Linear: B x L x D out
                return self.linears[i](x.transpose(1, 2))
            if i < len(self.linears):
                x = linear_channels_first(self.linears[i], x)
        return x.transpose(1, 2)

    def step(self, x: Tensor, cache: dict) -> Tensor:
        """The next ``n`` frames of a stream: ``x``: ``B x n x D`` -> ``B x n x D``, equal to ``forward``'s output at
        those frames over the whole stream (causal stacks only).

        ``cache`` is a dict owned by the caller, ``{}`` at the start of a stream; it holds each stage's recurrence
        (discrete matrices, built once per stream) and its ``B x D x N`` state.
        """
        if self.reverse:
            raise ValueError("an anti-causal SSM needs the whole sequence: it cannot run chunk by chunk")
        if "recurrences" not in cache:
            unstable = [type(k).__name__ for k in self.kernels if not k.prefix_stable()]
            if unstable:  # the kernel changes with the sequence length: no one recurrence reproduces it
                raise ValueError(f"{unstable[0]}'s kernel depends on the sequence length: it cannot run chunk by chunk")
            cache["recurrences"] = [kernel.recurrence(1) for kernel in self.kernels]
            cache["states"] = [r.initial_state(x.shape[0]).to(x.device) for r in cache["recurrences"]]
        if self.in_proj is not None:
            x = self.in_proj(x)
        for i, recurrence in enumerate(cache["recurrences"]):
            state = cache["states"][i]
            y, cache["states"][i] = recurrence.chunk(x.transpose(1, 2).to(state.dtype.to_real()), state)
            x = self.dropout(self.activate(y.to(x.dtype))).transpose(1, 2)
            if i < len(self.linears):
                x = self.linears[i](x)
        return x
