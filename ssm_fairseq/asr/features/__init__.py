"""Speech features: ``audio_features`` (audio -> 16 kHz mono -> 80-dim log-mel filterbanks, shared by data
preparation and transcription), ``filterbank`` (the same features chunk by chunk, for streams), ``transforms``
(the data directory's feature transforms applied, and checked finite), ``audio_spans`` (any span of a file as its
samples and filterbanks, read alone: long files)."""
