"""A SPADE language model's incremental states for the many hypotheses of a search, each token's keys stored once.

A search (shallow fusion, ``asr/search/lm_fusion.py``) extends, branches and drops hypotheses frame after frame. Kept
as fairseq incremental states, every branch copies its rows' attention windows (a reorder), every step of rows from
several states concatenates them, and every frame's kept rows are gathered again. Here each layer's keys and values
live in one store, a token's written once when it is fed; a row's attention window is a list of ``window`` indices
into it (right-aligned, the slots before the row's own keys masked), its SSM state a row of one tensor per global
layer. Branching a row copies its index list and SSM state; dropping rows selects the rows' lists; the keys
themselves are never copied, except when the store is compacted (``keep``, once it holds several times the keys the
kept rows can reach).

A step attends, for each row, the ``window`` keys its list names and its own new one (``LocalAttention.step_stored``),
which are exactly those its own incremental cache would hold (``LocalAttention._kept``: the last ``window`` keys,
or those of its chunk), so every row scores what the full forward pass over its prefix scores.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

COMPACT_SLOTS = 4096  # a store at most this many keys long is never compacted


class WindowTokenStore:
    """Rows of a ``SpadeDecoder``'s incremental state (plain integers, numbered as they are added), each after its
    own prefix of tokens: the interface of ``asr.search.lm_states.LanguageModelStates``.

    ``calls`` counts the decoder's steps (``SpadeDecoder.step_rows``, and the first tokens' ``forward``).
    """

    def __init__(self, decoder):
        attentions = [layer.attention for layer in decoder.layers]
        if len({(a.window, a.mode) for a in attentions}) != 1:
            raise ValueError("a token store needs the same attention window and mode in every layer")
        if any(layer.cross_attention is not None for layer in decoder.layers):
            raise ValueError("a token store steps decoder-only layers (no cross-attention)")
        self.decoder, self.attention = decoder, attentions[0]
        self.window = self.attention.window
        self.device = next(decoder.parameters()).device
        self.calls = 0
        self._rows = 0
        # per row, in buffers with room for more rows: its window (``R x window`` store slots, the last one its
        # newest key), its tokens seen, its SSM state in each global layer (None for a local layer)
        self._slots: Tensor | None = None
        self._seen: Tensor | None = None
        self._ssm: list[Tensor | None] = []
        self._recurrences: list = []  # each global layer's SSM recurrence (CausalSSM.step's), shared by the rows
        # each layer's keys and values, ``S x 2 x H x hd``; slot 0 is zeros (a window's masked slots name it)
        self._stores: list[Tensor] = []
        self._used = 1
        self._numbers = torch.arange(self.window + 1, device=self.device)  # 0, 1, 2, ...: kept for slots and masks

    def __len__(self) -> int:
        return self._rows

    @torch.no_grad()
    def start(self, prefix: tuple[int, ...], count: int) -> Tensor:
        """Add ``count`` rows fed ``prefix`` (the decoder's own incremental forward) -> their next-unit
        log-probabilities, ``count x V`` float32."""
        tokens = torch.tensor([prefix] * count, dtype=torch.long, device=self.device)
        state: dict = {}
        out = self.decoder(tokens, incremental_state=state)
        self.calls += 1
        caches = self.decoder.get_incremental_state(state, "spade")["layers"]
        seen = torch.full((count,), len(prefix), dtype=torch.long, device=self.device)
        slots = torch.zeros(count, self.window, dtype=torch.long, device=self.device)
        kept = self.attention._kept(len(prefix))
        if kept:
            new = torch.arange(count * kept, device=self.device).view(count, kept)
            slots[:, self.window - kept:] = self._used + new
        for i, cache in enumerate(caches):
            keys, values = self.decoder.layers[i].attention.keys_and_values(cache["attention"])  # B x H x kept x hd
            kv = torch.stack([keys, values], 1).permute(0, 3, 1, 2, 4).flatten(0, 1)  # (B kept) x 2 x H x hd
            if len(self._stores) <= i:
                self._stores.append(kv.new_zeros(1, *kv.shape[1:]))
                self._ssm.append(None)
                self._recurrences.append(cache["ssm"]["recurrence"] if "ssm" in cache else None)
            self._stores[i] = self._room(self._stores[i], self._used, len(kv))
            self._stores[i][self._used:self._used + len(kv)] = kv
        self._used += count * kept
        self._add(slots, seen, [cache["ssm"]["state"] if "ssm" in cache else None for cache in caches])
        return self._log_probs(out[0])

    @torch.no_grad()
    def advance(self, rows: Sequence[int], labels: Sequence[int]) -> Tensor:
        """Add one row per ``rows[i]``: its prefix followed by ``labels[i]``, numbered ``len(self) + i`` -> their
        next-unit log-probabilities, ``N x V`` float32, in the order of ``rows``; one decoder step for all."""
        count = len(rows)
        if not count:
            return torch.empty(0, 0)
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        seen = self._seen.index_select(0, index)
        first = self._used
        if first + count > len(self._numbers):
            self._numbers = torch.arange(2 * (first + count), device=self.device)
        # each row's window and its new token's slot; the keys its own cache would hold (the last ``kept``), and its own
        slots = torch.cat([self._slots.index_select(0, index), self._numbers[first:first + count, None]], 1)
        key_ok = self._numbers[:self.window + 1] >= self.window - self.attention._kept(seen)[:, None]
        ssm_caches = [None if states is None else {"recurrence": recurrence, "state": states.index_select(0, index)}
                      for states, recurrence in zip(self._ssm, self._recurrences)]
        self._stores = [self._room(store, first, count) for store in self._stores]
        logits = self.decoder.step_rows(torch.tensor(labels, dtype=torch.long, device=self.device), seen,
                                        self._stores, first, slots, key_ok, ssm_caches)
        self.calls += 1
        self._used += count
        self._add(slots[:, 1:], seen + 1, [None if cache is None else cache["state"] for cache in ssm_caches])
        return self._log_probs(logits)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (distinct, ascending), renumbered ``0, 1, ...`` in that order; the store is compacted to
        the keys the kept rows' windows name once it holds more than twice as many as they can."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self._rows = len(rows)
        self._slots = self._select(self._slots, index)
        self._seen = self._select(self._seen, index)
        self._ssm = [None if states is None else self._select(states, index) for states in self._ssm]
        if self._used > max(COMPACT_SLOTS, 2 * self._rows * self.window):
            self._compact()

    def _compact(self) -> None:
        """Keep only the store's keys that a row's window names (and slot 0), renumbering the windows."""
        slots = self._slots[:self._rows]
        live = torch.unique(torch.cat([slots.new_zeros(1), slots.flatten()]))  # ascending: slot 0 stays 0
        renumber = torch.zeros(self._used, dtype=torch.long, device=self.device)
        renumber[live] = torch.arange(len(live), device=self.device)
        self._slots[:self._rows] = renumber[slots]
        self._stores = [self._select(store, live) for store in self._stores]
        self._used = len(live)

    def _add(self, slots: Tensor, seen: Tensor, ssm_states: list[Tensor | None]) -> None:
        """Append rows: their windows, tokens seen and SSM states."""
        first, count = self._rows, len(seen)
        if self._slots is None:
            self._slots, self._seen, self._ssm = slots[:0], seen[:0], [s if s is None else s[:0] for s in ssm_states]
        self._slots = self._room(self._slots, first, count)
        self._seen = self._room(self._seen, first, count)
        self._ssm = [None if s is None else self._room(s, first, count) for s in self._ssm]
        self._slots[first:first + count] = slots
        self._seen[first:first + count] = seen
        for states, new in zip(self._ssm, ssm_states):
            if states is not None:
                states[first:first + count] = new
        self._rows += count

    @staticmethod
    def _room(buffer: Tensor, used: int, more: int) -> Tensor:
        """``buffer`` (its first ``used`` rows), or a copy of them with room for at least twice ``used + more``."""
        if used + more <= buffer.shape[0]:
            return buffer
        grown = buffer.new_empty(max(2 * (used + more), 16), *buffer.shape[1:])
        grown[:used] = buffer[:used]
        return grown

    @staticmethod
    def _select(buffer: Tensor, index: Tensor) -> Tensor:
        """The rows ``index`` of ``buffer`` in a new buffer with as many rows of room again."""
        out = buffer.new_empty(max(2 * len(index), 16), *buffer.shape[1:])
        torch.index_select(buffer, 0, index, out=out[:len(index)])
        return out

    def _log_probs(self, logits: Tensor) -> Tensor:
        """``B x 1 x V`` decoder output -> ``B x V`` float32 log-probabilities."""
        return self.decoder.get_normalized_probs((logits, None), log_probs=True)[:, -1].float()
