"""Streaming recognition: filterbanks chunk by chunk (``filterbank``) and ``StreamingTranscriber``
(``transcriber``: one ``ssm_fairseq.asr`` recognizer with one stream). The streams themselves, many per loaded
model, are ``ssm_fairseq.asr.stream``'s, built on the causal encoder's ``step`` (``modules``) and the resumable
searches (``generation``)."""
