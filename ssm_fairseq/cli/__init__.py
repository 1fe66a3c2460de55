"""The user-facing command-line programs, installed as console commands (``pyproject.toml``'s ``[project.scripts]``).

One module per command, each with a ``main(argv) -> exit status``: ``prepare_librispeech``
(``ssm-prepare-librispeech``), ``average_checkpoints`` (``ssm-average-checkpoints``) and ``plot_kernels``
(``ssm-plot-kernels``); ``ssm-transcribe`` is ``ssm_fairseq.transcribe``. ``scripts/NAME.py`` in the repository
runs the same ``main``, so ``python scripts/NAME.py`` and ``ssm-NAME`` take the same arguments. Nothing here is
imported by ``ssm_fairseq`` itself (nor by ``fairseq-train --user-dir``).
"""
