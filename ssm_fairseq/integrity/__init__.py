"""Checks that refuse what would otherwise give a silently wrong result.

``checkpoint_checks`` (every checkpoint fairseq reads: zip CRCs, finite weights, the same model on resume, a finished
training; run by ``ssm_fairseq.fairseq_patches``), ``checkpoint_errors`` (the errors that refuse a checkpoint),
``vocabulary_fingerprint`` (SentencePiece models fingerprinted by content), ``dictionary_digest`` (the text models'
dictionary digests), ``task_check`` (fairseq text tasks refusing our architectures they cannot train),
``feature_check`` and ``manifest_check`` (a speech data directory's features and manifests), ``language_model_check``
(an LM fused with a transducer has the transducer's units, in order).
"""
