#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.mlm_reach`` (documented there), as the installed ``ssm-mlm-reach`` does."""
import sys

from ssm_fairseq.cli.mlm_reach import main

if __name__ == "__main__":
    sys.exit(main())
