"""Streaming recognition: filterbanks chunk by chunk, the causal encoder's state carried across chunks, searches
that carry their hypotheses across chunks, and the streaming transcriber."""
