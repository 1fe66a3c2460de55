"""The speech encoder (torch only): ``speech_encoder`` (sub-sampler + encoder layers + final LayerNorm; ``step``: a
causal encoder chunk by chunk) and ``subsampling`` (conv, tr and ms sub-samplers)."""
