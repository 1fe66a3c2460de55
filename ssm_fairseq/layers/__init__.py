"""nn.Modules shared by the speech and text models, built on ``ssm_fairseq.ssm`` (torch only, no fairseq).

``state_space`` holds the SSM blocks (multi-head SSM, bidirectional block, causal SSM sub-layer, SSM ablation),
``attention`` the attention blocks (self, sliding-window / chunk, cross, T5's relative positions). Directly here:
the layers built from them (``encoder_layer``: MSSM, Stateformer, transformer, Conformer, S4 and sliding-window
encoder layers; ``spade_layer``: SPADE's global and local layers; ``conformer_convolution``) and what every block
uses (``dropout``, ``feed_forward``, ``recompute``).
"""
