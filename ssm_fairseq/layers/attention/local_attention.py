"""Local multi-head self-attention (sliding window or chunk) for SPADE's local layers."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..recompute import recomputed

MODES = ("window", "chunk")


def _pad_seq(t: Tensor, before: int, after: int) -> Tensor:
    """Zero- (or False-) pad dim 2 of a ``B x H x L x C`` tensor: ``B x H x (before + L + after) x C``."""
    return F.pad(t, (0, 0, before, after))


class LocalAttention(nn.Module):
    """Multi-head self-attention restricted to a local neighbourhood: ``B x L x D -> B x L x D``.

    ``mode="window"``: query ``i`` attends keys ``j`` with ``|i - j| <= window`` (causal: ``i - window <= j <= i``).
    ``mode="chunk"``: the sequence is cut into consecutive chunks of ``window`` tokens and query ``i`` attends the
    keys of its own chunk (causal: only those with ``j <= i``).

    Memory: the sequence is split into ``nb = ceil(L / window)`` blocks of ``window`` queries, each scored only
    against a span of ``c * window`` keys (``c`` = 3 for bidirectional window, 2 for causal window, 1 for chunk),
    so scores and masks are ``B x H x nb x window x c*window``: ``O(B * heads * L * window)``, never ``L x L``.
    In training on a CPU the blocks (each key copied into ``c`` spans) are formed again in the backward pass
    (``recompute.recomputed``), which keeps only ``q``, ``k`` and ``v`` for it.
    Incremental decoding (causal only) keeps at most ``window`` keys/values per layer (in a buffer of twice that,
    ``O(B * D * window)``) and uses ``O(B * heads * (n + window) * window)`` for ``n`` new tokens. The rows of a
    cache may have seen different numbers of tokens (``concatenate_caches``): each row's keys are right-aligned in
    the buffer, and a per-row count of the slots before them (``missing``) masks those out.
    """

    def __init__(
        self, dim: int, heads: int, window: int, mode: str = "window", causal: bool = False, dropout: float = 0.0
    ):
        super().__init__()
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of attention heads ({heads})")
        if mode not in MODES:
            raise ValueError(f"unknown local attention mode {mode!r}; expected one of {MODES}")
        self.heads, self.window, self.mode, self.causal, self.dropout = heads, window, mode, causal, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, cache: dict | None = None,
                position_bias: nn.Module | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``key_padding_mask``: ``B x L``, True at padded positions; ``position_bias``: maps
        key-minus-query distances (an integer tensor) to a ``heads x ...`` additive score bias (T5's).

        With ``cache`` (a dict owned by the caller, initially ``{}``; causal only, no padding mask) ``x`` holds
        the ``n`` tokens that follow everything fed before; the cache is updated in place.
        """
        if cache is not None and not self.causal:
            raise ValueError("incremental decoding (cache) requires causal=True")
        if cache is not None and key_padding_mask is not None:
            raise ValueError("key_padding_mask is not supported together with cache")
        B, n, D = x.shape
        qkv = self.qkv(x).view(B, n, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # 3 x B x H x n x hd
        q, k, v = qkv
        if cache is None:
            key_ok = None if key_padding_mask is None else ~key_padding_mask
            y = recomputed(self._attend, q, k, v, key_ok, position_bias)  # on a CPU keeps only q, k, v
        else:
            y = self._attend_cached(q, qkv[1:].transpose(0, 1), cache, position_bias)
        return self.out_proj(y.transpose(1, 2).reshape(B, n, D))

    def step_stored(self, x: Tensor, store: Tensor, first: int, slots: Tensor, key_ok: Tensor) -> Tensor:
        """One new token per row whose earlier keys and values sit in a token store (``text/token_store.py``: each
        token's once, a row's window an index list), causal only: ``x`` ``B x 1 x D`` -> ``B x 1 x D``.

        The new tokens' keys and values are written to ``store[first:first + B]`` (``store``: ``S x 2 x H x hd``);
        then row ``b`` attends the keys ``store[slots[b]]`` (``slots``: ``B x K``, ``K <= window + 1``, ending with
        its own token's slot ``first + b``) where ``key_ok`` (``B x K``, True at least at the last) allows: the keys a
        row's cache would hold (``_kept``) and its own, as ``_attend_cached`` attends them."""
        B, _, D = x.shape
        qkv = self.qkv(x).view(B, 3, self.heads, D // self.heads)
        store[first:first + B] = qkv[:, 1:]
        kv = store.index_select(0, slots.flatten()).view(B, slots.shape[1], *store.shape[1:])  # B x K x 2 x H x hd
        k, v = kv.permute(2, 0, 3, 1, 4)  # B x H x K x hd each
        y = F.scaled_dot_product_attention(qkv[:, 0, :, None], k, v, attn_mask=key_ok[:, None, None])
        return self.out_proj(y.transpose(1, 2).reshape(B, 1, D))

    @staticmethod
    def _distances(rows: int, before: int, span: int, device: torch.device) -> Tensor:
        """``rows x span``: query index minus key index, ``i - j``, of query ``s`` of a block and slot ``t`` of its
        key span, which starts ``before`` positions before the block (the same in every block)."""
        s = torch.arange(rows, device=device)[:, None]
        t = torch.arange(span, device=device)[None, :]
        return s + before - t

    def _rule(self, dist: Tensor) -> Tensor:
        """A bool tensor of ``dist``'s shape from ``_distances``: may the query attend that key? (In chunk mode a
        block is the chunk and its span, so ``|i - j| < window`` there.)"""
        return (dist >= (0 if self.causal else -self.window)) & (dist <= self.window)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, key_ok: Tensor | None,
                position_bias: nn.Module | None = None) -> Tensor:
        """Blocked local attention over aligned ``q``, ``k``, ``v`` (``B x H x L x hd``) -> ``B x H x L x hd``.

        Position 0 must lie on a chunk boundary. ``key_ok``: ``B x L``, True at real keys (None: all real).
        A sequence no longer than the window is one block of ``L`` queries over its ``L`` keys (every key is then
        within reach of every query, but for causality), not a window of queries over three windows of keys; with
        nothing padded and no position bias, that is plain (causal) attention, without a mask.
        """
        B, H, L, hd = q.shape
        dropout = self.dropout if self.training else 0.0
        if L <= self.window and key_ok is None and position_bias is None:  # nothing to mask but for causality
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=self.causal)
        w = min(self.window, L)  # queries per block
        nb = -(-L // w)
        extra = nb * w - L
        before = w if self.mode == "window" and nb > 1 else 0
        ahead = w if self.mode == "window" and not self.causal and nb > 1 else 0
        span = before + w + ahead
        if key_ok is None:
            key_ok = torch.ones(B, L, dtype=torch.bool, device=q.device)
        ok = _pad_seq(key_ok[:, None, :, None], before, extra + ahead).unfold(2, span, w)  # B x 1 x nb x 1 x span
        dist = self._distances(w, before, span, q.device)
        allowed = self._rule(dist) & ok  # B x 1 x nb x w x span
        # a query without any key (padding) attends its whole span: its output is unused, and stays finite
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        mask = allowed
        if position_bias is not None:
            mask = self._biased(allowed, position_bias(-dist)[None, :, None].to(q.dtype))  # B x H x nb x w x span

        def blocks_as_batch(t: Tensor) -> Tensor:  # B x H' x nb x rows x C -> (B nb) x H' x rows x C
            return t.transpose(1, 2).flatten(0, 1)

        # each block is one batch row of a fused attention, which does not keep the scores for the backward pass
        y = F.scaled_dot_product_attention(
            blocks_as_batch(_pad_seq(q, 0, extra).view(B, H, nb, w, hd)),
            blocks_as_batch(_pad_seq(k, before, extra + ahead).unfold(2, span, w).transpose(-1, -2)),
            blocks_as_batch(_pad_seq(v, before, extra + ahead).unfold(2, span, w).transpose(-1, -2)),
            attn_mask=blocks_as_batch(mask), dropout_p=dropout,
        )  # (B nb) x H x w x hd
        return y.unflatten(0, (B, nb)).transpose(1, 2).reshape(B, H, nb * w, hd)[:, :, :L]

    def _attend_cached(self, q: Tensor, kv: Tensor, cache: dict, position_bias: nn.Module | None = None) -> Tensor:
        """Attend ``n`` new tokens (queries ``B x H x n x hd``, keys and values ``B x 2 x H x n x hd``) over cached +
        new keys; update ``cache`` in place.

        The cache: a buffer ``kv`` (``B x 2 x H x capacity x hd``) whose slots ``end - length .. end - 1`` hold the
        cached keys and values, oldest first; optionally ``missing`` (``B``, long): how many of those ``length``
        slots come before row ``b``'s own keys (a row that has seen fewer tokens than others, after
        ``concatenate_caches``), absent when every row has all ``length``. The cached keys start at a chunk boundary
        (chunk mode), so prepending them and left-padding the queries by as many dummy rows aligns everything for
        :meth:`_attend`; with ``missing``, at most ``window`` new tokens are attended at a time.
        """
        m, n, missing = cache.get("length", 0), q.shape[2], cache.get("missing")
        if missing is not None and n > self.window:  # per-row masks cover at most a window of queries
            return torch.cat([self._attend_cached(q[:, :, s:s + self.window], kv[:, :, :, s:s + self.window], cache,
                                                  position_bias) for s in range(0, n, self.window)], 2)
        k, v = self._extend_cache(cache, kv) if m else kv.unbind(1)
        if n <= self.window:
            y = self._attend_recent(q, k, v, position_bias, cache)
        else:
            y = self._attend(_pad_seq(q, m, 0), k, v, None, position_bias)[:, :, m:]
        keep = self._kept(m + n)  # the longest row's keys a next token may attend
        if missing is not None:
            kept = self._kept(m - missing + n)  # each row's
            keep = int(kept.max())
            self._set_missing(cache, keep - kept)
        if m:
            cache["length"] = keep
        else:  # the first tokens: a buffer of the kept tail, with room for the next window's keys
            B, H, _, hd = k.shape
            cache.update(kv=k.new_empty(B, 2, H, keep + self.window, hd), end=0, length=0)
            self._extend_cache(cache, kv[:, :, :, kv.shape[3] - keep:])
        return y

    def _kept(self, seen):
        """Of a row's last ``seen`` keys (an int or a tensor of them; its chunk's in chunk mode), how many a next
        token may attend: the last ``window`` (window mode) or those since its chunk began (chunk mode)."""
        if self.mode == "chunk":
            return seen % self.window
        return min(seen, self.window) if isinstance(seen, int) else seen.clamp(max=self.window)

    @staticmethod
    def _set_missing(cache: dict, missing: Tensor) -> None:
        """Store the rows' ``missing`` slots, or none where no row misses any (every row has the cache's length)."""
        if bool(missing.any()):
            cache["missing"] = missing
        else:
            cache.pop("missing", None)

    def concatenate_caches(self, caches: list[dict]) -> dict:
        """One cache of the rows of ``caches``, in order, whatever number of tokens each row has seen: each row's
        keys are copied right-aligned into a new buffer as long as the most any row keeps, and ``missing`` counts
        the slots before them. Stepping the result with ``n`` new tokens per row gives each row what stepping its
        own cache would (the caches must each have seen at least one token)."""
        parts, valid = [], []
        for cache in caches:
            if "kv" not in cache:
                raise ValueError("a local-attention cache that has seen no token cannot be concatenated")
            length, end = cache["length"], cache["end"]
            part = cache["kv"][:, :, :, end - length:end]  # b x 2 x H x length x hd
            parts.append(part)
            rows = torch.full((part.shape[0],), length, dtype=torch.long, device=part.device)
            valid.append(rows - cache["missing"] if "missing" in cache else rows)
        valid = torch.cat(valid)
        length = int(valid.max())
        first = parts[0]
        # the room after the keys is written before it is read; only the slots before a part's keys are zeroed
        # (finite: masked scores of 0 weight)
        buffer = first.new_empty(valid.numel(), 2, first.shape[2], length + self.window, first.shape[4])
        start = 0
        for part in parts:
            count = min(part.shape[3], length)
            rows = slice(start, start + part.shape[0])
            buffer[rows, :, :, :length - count] = 0
            buffer[rows, :, :, length - count:length] = part[:, :, :, part.shape[3] - count:]
            start += part.shape[0]
        out = dict(kv=buffer, end=length, length=length)
        self._set_missing(out, length - valid)
        if "bias_by_distance" in caches[0]:  # depends on the window only
            out["bias_by_distance"] = caches[0]["bias_by_distance"]
        return out

    def keys_and_values(self, cache: dict) -> tuple[Tensor, Tensor]:
        """The cached keys and values: ``B x H x m x hd`` each (``m <= window``), views into the cache's buffer."""
        return cache["kv"][:, :, :, cache["end"] - cache["length"]:cache["end"]].unbind(1)

    def _extend_cache(self, cache: dict, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``n`` new keys and values (``B x 2 x H x n x hd``) after the ``m`` cached ones and return all
        ``m + n`` keys and values (``B x H x (m + n) x hd``, views into the buffer ``cache["kv"]``, ``B x 2 x H x
        capacity x hd``).

        A token costs one write of its own key and value; when the buffer is full, the cached keys move to the
        front of a buffer with room for ``window`` more (``O(window)`` once per ``window`` tokens), where
        concatenating at each token would copy all ``m`` cached keys every time.
        """
        buffer, end, m, n = cache["kv"], cache["end"], cache["length"], kv.shape[3]
        if end + n > buffer.shape[3]:
            moved = buffer.new_empty(*buffer.shape[:3], m + n + self.window, buffer.shape[4])
            moved[:, :, :, :m] = buffer[:, :, :, end - m:end]
            buffer, end = moved, m
        buffer[:, :, :, end:end + n] = kv
        cache.update(kv=buffer, end=end + n, length=m + n)
        return buffer[:, :, :, end - m:end + n].unbind(1)

    def _attend_recent(self, q: Tensor, k: Tensor, v: Tensor, position_bias: nn.Module | None = None,
                       cache: dict | None = None) -> Tensor:
        """The last ``n`` positions' queries (``B x H x n x hd``, ``n <= window``) over all ``m + n`` keys given
        (``B x H x (m + n) x hd``, the cache's and the new ones), scored as one ``n x (m + n)`` matrix: a generated
        token costs ``O(window)``, where the blocks of ``_attend`` would score ``window x 2 window``.

        The cache holds only keys a next token may attend (the last ``window``, or its chunk's), so a single query
        needs no mask unless rows miss leading slots (the cache's ``missing``: a per-row mask, ``B x 1 x n x
        (m + n)``). The mask (with the position bias) depends only on ``n`` and ``m + n`` otherwise: without
        autograd it is kept in ``cache`` and reused while they stay the same, as they do token after token once the
        window is full; a single token's bias (window mode) is a slice of one row kept per sequence
        (``_single_query_bias``)."""
        n, total = q.shape[2], k.shape[2]
        missing = None if cache is None else cache.get("missing")
        mask = None
        reusable = cache is not None and not torch.is_grad_enabled()
        if reusable and n == 1 and position_bias is not None and self.mode == "window":
            mask = self._single_query_bias(position_bias, cache, total, q)
            if missing is not None:
                own = torch.arange(total, device=q.device) >= missing[:, None]  # B x (m + n)
                mask = mask.masked_fill(~own[:, None, None], float("-inf"))  # B x heads x 1 x (m + n)
        elif missing is None and reusable and cache.get("recent_mask", (None,))[0] == (n, total):
            mask = cache["recent_mask"][1]
        elif n == 1 and position_bias is None and missing is not None:
            # one token attends every cached key of its row (the cache keeps only those): all but the missing slots
            mask = (torch.arange(total, device=q.device) >= missing[:, None])[:, None, None]  # B x 1 x 1 x (m + 1)
        elif n > 1 or position_bias is not None or missing is not None:
            i = torch.arange(total - n, total, device=q.device)[:, None]
            j = torch.arange(total, device=q.device)[None, :]
            dist = i - j  # n x (m + n)
            if missing is not None:  # each row's positions from its first own key, which starts its chunk
                i, j = i - missing[:, None, None], j - missing[:, None, None]  # B x n x 1, B x 1 x (m + n)
            same_span = dist <= self.window if self.mode == "window" else i // self.window == j // self.window
            mask = (dist >= 0) & same_span & (j >= 0)  # every row holds its own position
            if missing is not None:
                mask = mask[:, None]  # B x 1 x n x (m + n)
            if position_bias is not None:
                mask = self._biased(mask, position_bias(-dist).to(q.dtype))  # [B x] heads x n x (m + n)
            if reusable and missing is None:  # a tuple: beam search's reordering passes it by (no batch dimension)
                cache["recent_mask"] = (n, total), mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              dropout_p=self.dropout if self.training else 0.0)

    def _single_query_bias(self, position_bias: nn.Module, cache: dict, total: int, q: Tensor) -> Tensor:
        """The attention bias of one new token over its ``total`` keys (window mode, no autograd): ``heads x 1 x
        total``. The cached keys are exactly those the token attends, at distances ``total - 1 .. 0``, so the bias
        is the tail of one row of the biases of distances ``window .. 0``, computed once per sequence: a generated
        token builds no mask, whether or not the window is full yet."""
        if cache.get("bias_by_distance", (None,))[0] != self.window:
            distance = torch.arange(self.window, -1, -1, device=q.device)
            # a tuple: the batch reordering of beam search passes it by (it has no batch dimension)
            cache["bias_by_distance"] = self.window, position_bias(-distance).to(q.dtype)  # heads x (window + 1)
        return cache["bias_by_distance"][1][:, None, -total:]

    @staticmethod
    def _biased(allowed: Tensor, bias: Tensor) -> Tensor:
        """An additive attention mask: ``bias`` where ``allowed``, ``-inf`` elsewhere (shapes broadcast)."""
        return bias.masked_fill(~allowed, float("-inf"))

    @staticmethod
    def reorder_cache(cache: dict, new_order: Tensor) -> None:
        """Beam search: select ``new_order`` along the batch dim of every cached tensor, in place; slots that no row
        kept needs any more (every row misses them) are dropped. Only the buffer's cached slots are copied, into a
        new buffer with room for ``window`` more (never written before the next tokens are: a fresh allocation's
        untouched pages cost nothing, where copying the old buffer whole would touch them all)."""
        for key, value in cache.items():
            if isinstance(value, Tensor) and key != "kv":
                cache[key] = value.index_select(0, new_order)
        if "kv" in cache:
            buffer, end, length = cache["kv"], cache["end"], cache["length"]
            cached = buffer[:, :, :, end - length:end]
            if buffer.requires_grad and torch.is_grad_enabled():  # out= does not record autograd: no room then
                selected = cached.index_select(0, new_order)
            else:
                room = max(buffer.shape[3] - length, 1)
                selected = buffer.new_empty(new_order.numel(), *buffer.shape[1:3], length + room, buffer.shape[4])
                torch.index_select(cached, 0, new_order, out=selected[:, :, :, :length])
            cache["kv"], cache["end"] = selected, length
        if "missing" in cache and cache["missing"].numel():
            unused = int(cache["missing"].min())
            cache["length"] -= unused
            LocalAttention._set_missing(cache, cache["missing"] - unused)
