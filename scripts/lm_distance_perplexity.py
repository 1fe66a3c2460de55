#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.lm_distance_perplexity`` (documented there), as the installed ``ssm-lm-distance-ppl`` does."""
import sys

from ssm_fairseq.cli.lm_distance_perplexity import main

if __name__ == "__main__":
    sys.exit(main())
