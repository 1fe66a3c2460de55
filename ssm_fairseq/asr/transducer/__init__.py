"""The RNN transducer and its fairseq parts.

Torch only: ``predictor`` (prediction network), ``joiner`` (additive joiner), ``rnnt_loss`` (RNN-T loss backends,
sub-batched joiner + loss), ``pruned_rnnt_loss`` (pruned RNN-T). With fairseq, registered by
``ssm_fairseq.registration``: ``model`` (model ``transducer`` and its architectures), ``criterion`` (criterion
``transducer``), ``task`` (task ``speech_transducer``; ``data_config`` reads its config.yaml, ``seeded_items`` seeds
its augmentation per utterance).
"""
