"""Incremental decoding for decoders whose layers keep their own caches (SPADE's LM and encoder-decoder)."""
from typing import Optional

from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor


class LayerCacheDecoder(FairseqIncrementalDecoder):
    """A ``FairseqIncrementalDecoder`` with ``self.layers``, each taking a cache dict and having ``reorder_cache``.

    fairseq passes the whole prefix at every step; ``unseen`` returns only the positions not fed before, with
    one cache per layer (window keys/values, SSM state, cross-attention keys/values), so every step costs the
    same whatever the prefix length.
    """

    def unseen(self, tokens: Tensor, incremental_state) -> tuple[Tensor, Optional[list]]:
        """``B x T`` prefix -> (``B x n`` new tokens, per-layer caches), or ``(tokens, None)`` without a state."""
        if incremental_state is None:
            return tokens, None
        state = self.get_incremental_state(incremental_state, "spade")
        if state is None:
            state = {"seen": 0, "layers": [{} for _ in self.layers]}
            self.set_incremental_state(incremental_state, "spade", state)
        tokens = tokens[:, state["seen"]:]
        state["seen"] += tokens.shape[1]
        return tokens, state["layers"]

    def reorder_incremental_state(self, incremental_state, new_order: Tensor) -> None:
        state = self.get_incremental_state(incremental_state, "spade")
        if state is not None:
            for layer, cache in zip(self.layers, state["layers"]):
                layer.reorder_cache(cache, new_order)
