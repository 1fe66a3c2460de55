#!/usr/bin/env python
"""Runs ``ssm_fairseq.cli.export_onnx`` (documented there), as the installed ``ssm-export-onnx`` does."""
import sys

from ssm_fairseq.cli.export_onnx import main

if __name__ == "__main__":
    sys.exit(main())
