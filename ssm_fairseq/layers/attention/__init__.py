"""Attention blocks: ``self_attention`` (full, with relative positions), ``local_attention`` (sliding-window and
chunk attention with an incremental cache), ``cross_attention`` (encoder-decoder, cached keys and values),
``relative_position`` (T5's buckets and bias)."""
