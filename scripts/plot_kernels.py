#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.plot_kernels`` (documented there), as the installed ``ssm-plot-kernels`` does."""
import sys

from ssm_fairseq.cli.plot_kernels import main

if __name__ == "__main__":
    sys.exit(main())
