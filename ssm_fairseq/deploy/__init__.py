"""Deployment without PyTorch: a streaming transducer exported to ONNX, and a recognizer on ONNX Runtime.

``exporter`` (torch: ``ssm-export-onnx``) writes a directory of three graphs (``export_graphs``: the encoder's chunk
step with every SSM state an input and an output, the predictor's step, the joiner) and its ``manifest``. The rest
imports no torch and no fairseq (numpy, onnxruntime, soundfile): ``onnx_transducer`` runs the graphs,
``filterbank`` computes the features, ``search`` the greedy and beam searches, ``recognizer`` transcribes files and
streams, ``transcribe`` is ``ssm-transcribe --onnx``. ``errors`` names what is refused. docs/deploy.md has the how
and the measurements. Nothing is imported here.
"""
