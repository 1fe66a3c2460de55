"""SSM blocks: ``multihead_ssm`` (stacked multi-head SSM of one direction, with step mode), ``bidirectional_ssm``
(the MSSM paper's bidirectional block), ``causal_ssm`` (SPADE's causal SSM sub-layer with step mode),
``ssm_ablation`` (a trained model with its SSM sub-layers' outputs zeroed)."""
