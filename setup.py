"""A setuptools entry point for tools that still run ``python setup.py ...``.

Everything (name, version, dependencies, console commands, packages) is declared once, in ``pyproject.toml``;
``setuptools.setup()`` reads it from there. Install with ``make setup`` or ``pip install -e .`` (README.md).
"""
from setuptools import setup

setup()
