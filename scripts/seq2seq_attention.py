#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.seq2seq_attention`` (documented there), as the installed ``ssm-seq2seq-attention`` does."""
import sys

from ssm_fairseq.cli.seq2seq_attention import main

if __name__ == "__main__":
    sys.exit(main())
