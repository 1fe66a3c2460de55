#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.prepare_lm_text`` (documented there), as the installed ``ssm-prepare-lm-text`` does."""
import sys

from ssm_fairseq.cli.prepare_lm_text import main

if __name__ == "__main__":
    sys.exit(main())
