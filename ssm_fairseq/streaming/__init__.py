"""Streaming recognition: filterbanks chunk by chunk (``filterbank``) and the streaming transcriber
(``transcriber``), built on the causal encoder's ``step`` (``modules``) and the resumable searches
(``generation``)."""
