"""nn.Modules built on ``ssm_fairseq.ssm`` (torch only): MSSM blocks, encoder layers, sub-samplers, transducer parts."""
