#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.mlm_evidence_perplexity`` (documented there), as the installed ``ssm-mlm-evidence-ppl`` does."""
import sys

from ssm_fairseq.cli.mlm_evidence_perplexity import main

if __name__ == "__main__":
    sys.exit(main())
