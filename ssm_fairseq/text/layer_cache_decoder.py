"""Incremental decoding for decoders whose layers keep their own caches (SPADE's LM and encoder-decoder)."""
from typing import Any, Optional

import torch
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor


class LayerCacheDecoder(FairseqIncrementalDecoder):
    """A ``FairseqIncrementalDecoder`` with ``self.layers``, each taking a cache dict and having ``reorder_cache``
    (a ``SpadeLayer``: its cache's ``"attention"`` part belongs to its ``LocalAttention``, ``layer.attention``; the
    other parts hold tensors whose first dimension is the batch, and objects the rows share).

    fairseq passes the whole prefix at every step; ``unseen`` returns only the positions not fed before, with
    one cache per layer (window keys/values, SSM state, cross-attention keys/values), so every step costs the
    same whatever the prefix length.

    The rows of one state may have seen different numbers of tokens (``concatenate_incremental_states``): each is
    then fed its whole prefix left-padded to the longest one's (as fairseq's ``left_pad`` batches are), the same
    number of new tokens each.

    A step keeps the rows of the state it was given (``STEP_KEEPS_ROWS``): it replaces the state's tensors, or writes
    into a local-attention buffer only past the slots its rows hold, and changes its dicts. So one step of a copy of
    the dicts (sharing the tensors) leaves the original state's rows as they were; a second step of another such copy
    would write into the same free slots (a search steps a state it keeps only once).
    """

    STEP_KEEPS_ROWS = True

    def unseen(self, tokens: Tensor, incremental_state) -> tuple[Tensor, Optional[list]]:
        """``B x T`` prefix -> (``B x n`` new tokens, per-layer caches), or ``(tokens, None)`` without a state.

        The state keeps ``seen``, the tokens its longest row has been fed, and, where its rows differ, ``behind``
        (``B``, long): how many fewer each row has been fed. A row ``behind`` must come left-padded by as many
        ``padding_idx`` tokens (``ValueError`` otherwise)."""
        if incremental_state is None:
            return tokens, None
        state = self.get_incremental_state(incremental_state, "spade")
        if state is None:
            state = {"seen": 0, "layers": [{} for _ in self.layers]}
            self.set_incremental_state(incremental_state, "spade", state)
        seen = state["seen"]
        if "behind" in state:
            own = tokens[:, :seen].ne(self.padding_idx).sum(1)
            if not torch.equal(own, seen - state["behind"]):
                raise ValueError(f"rows of an incremental state fed {own.tolist()} tokens before their new ones, "
                                 f"where they have seen {(seen - state['behind']).tolist()}: each row's prefix must "
                                 f"be left-padded to the longest row's, with the same number of new tokens in each")
        tokens = tokens[:, seen:]
        state["seen"] += tokens.shape[1]
        return tokens, state["layers"]

    def reorder_incremental_state(self, incremental_state, new_order: Tensor) -> None:
        state = self.get_incremental_state(incremental_state, "spade")
        if state is not None:
            for layer, cache in zip(self.layers, state["layers"]):
                layer.reorder_cache(cache, new_order)
            if "behind" in state:
                behind = state["behind"].index_select(0, new_order)
                ahead = int(behind.min()) if behind.numel() else 0  # the longest row kept is this much shorter
                state["seen"] -= ahead
                _set_behind(state, behind - ahead)

    def concatenate_incremental_states(self, incremental_states: list) -> dict:
        """A new incremental state whose rows are those of ``incremental_states`` (each fed at least one token), in
        order, whatever number of tokens each row has been fed; stepping it gives each row what stepping its own
        state would. The states are not changed (new tensors)."""
        states = [self.get_incremental_state(s, "spade") for s in incremental_states]
        if any(state is None or not state["seen"] for state in states):
            raise ValueError("an incremental state that has been fed no token cannot be concatenated")
        seen = max(state["seen"] for state in states)
        behind = []
        for state in states:
            rows = _rows(state["layers"])
            base = torch.full((rows,), seen - state["seen"], dtype=torch.long, device=_device(state["layers"]))
            behind.append(base + state["behind"] if "behind" in state else base)
        layers = [_concatenate_layer_caches(layer, [state["layers"][i] for state in states])
                  for i, layer in enumerate(self.layers)]
        merged = {"seen": seen, "layers": layers}
        _set_behind(merged, torch.cat(behind))
        out: dict = {}
        self.set_incremental_state(out, "spade", merged)
        return out


def _set_behind(state: dict, behind: Tensor) -> None:
    """Store the rows' ``behind`` counts, or none where every row has seen ``seen`` tokens."""
    if bool(behind.any()):
        state["behind"] = behind
    else:
        state.pop("behind", None)


def _tensors(value: Any):
    """Every tensor in nested dicts and lists."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list):
        for item in value:
            yield from _tensors(item)


def _rows(layers: list) -> int:
    """The batch size of a state's layer caches (the first dimension of their tensors)."""
    return next(_tensors(layers)).shape[0]


def _device(layers: list) -> torch.device:
    return next(_tensors(layers)).device


def _concatenate_layer_caches(layer, caches: list[dict]) -> dict:
    """One layer's caches of several states, concatenated row-wise: the attention's by its ``concatenate_caches``
    (rows of different lengths), the rest by ``_concatenate_rows``."""
    keys = set(caches[0])
    if any(set(cache) != keys for cache in caches):
        raise ValueError(f"the layer caches to concatenate hold different parts: {[sorted(c) for c in caches]}")
    return {key: layer.attention.concatenate_caches([c[key] for c in caches]) if key == "attention"
            else _concatenate_rows([c[key] for c in caches]) for key in caches[0]}


def _concatenate_rows(values: list) -> Any:
    """Tensors concatenated along their first (batch) dimension, dicts and lists part by part; any other value
    must be the same object in every state (an SSM's recurrence, which all rows share)."""
    first = values[0]
    if isinstance(first, Tensor):
        return torch.cat(values)
    if isinstance(first, dict):
        return {key: _concatenate_rows([value[key] for value in values]) for key in first}
    if isinstance(first, list):
        return [_concatenate_rows([value[i] for value in values]) for i in range(len(first))]
    if any(value is not first for value in values):
        raise ValueError(f"the caches to concatenate hold different {type(first).__name__} objects, which no row "
                         f"owns: they cannot be concatenated")
    return first
