#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.average_checkpoints`` (documented there), as the installed ``ssm-average-checkpoints`` does."""
import sys

from ssm_fairseq.cli.average_checkpoints import main

if __name__ == "__main__":
    sys.exit(main())
