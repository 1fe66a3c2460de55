#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.prepare_librispeech`` (documented there), as the installed ``ssm-prepare-librispeech`` does."""
import sys

from ssm_fairseq.cli.prepare_librispeech import main

if __name__ == "__main__":
    sys.exit(main())
