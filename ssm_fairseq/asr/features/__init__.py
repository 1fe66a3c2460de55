"""Speech features: ``audio_features`` (audio -> 16 kHz mono -> 80-dim log-mel filterbanks, shared by data
preparation and transcription), ``filterbank`` (the same features chunk by chunk, for streams), ``transforms``
(the data directory's feature transforms applied, and checked finite; a stream's own state of them; the CMVN a
decoding asks for), ``running_cmvn`` (streaming-adaptive CMVN: statistics that follow the stream from the training
set's; numpy only) and ``adaptive_cmvn`` (the same as fairseq's ``adaptive_cmvn`` feature transform), ``audio_spans``
(any span of a file as its samples and filterbanks, read alone: long files), ``feature_files`` (a stored ``.npy``
feature file checked from its header)."""
