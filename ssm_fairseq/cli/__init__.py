"""The user-facing command-line programs, installed as console commands (``pyproject.toml``'s ``[project.scripts]``).

One module per command, each with a ``main(argv) -> exit status``: ``prepare_librispeech``
(``ssm-prepare-librispeech``), ``average_checkpoints`` (``ssm-average-checkpoints``), ``prepare_lm_text``
(``ssm-prepare-lm-text``), ``plot_kernels`` (``ssm-plot-kernels``), ``lm_distance_perplexity``
(``ssm-lm-distance-ppl``) and ``mlm_evidence_perplexity`` (``ssm-mlm-evidence-ppl``; the two share
``bucketed_perplexity``), ``mlm_reach`` (``ssm-mlm-reach``), ``seq2seq_attention`` (``ssm-seq2seq-attention``)
and ``transcribe`` (``ssm-transcribe``, also ``python -m ssm_fairseq.transcribe``). ``scripts/NAME.py`` in the repository
runs the same ``main``, so ``python scripts/NAME.py`` and ``ssm-NAME`` take the same arguments. Nothing here is
imported by ``ssm_fairseq`` itself (nor by ``fairseq-train --user-dir``).
"""
