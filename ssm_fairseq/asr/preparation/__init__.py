"""Speech data preparation, step by step, as ``ssm-prepare-librispeech`` (``ssm_fairseq.cli.prepare_librispeech``)
runs it: ``corpus`` (a corpus in LibriSpeech's layout read and its utterance ids checked), ``features`` (filterbanks
on several processes, reused while their audio is unchanged), ``vocabulary`` (SentencePiece and its fairseq
dictionary, refused when a re-run would change them), ``cmvn`` (the directory's CMVN checked on a re-run, the training
set's global statistics), ``manifests`` (fairseq's manifests, written atomically) and ``config_file``
(``config.yaml``, paths relative to the directory)."""
