"""Live recognition over WebSocket (``ssm-serve``, ``ssm_fairseq.cli.serve``): one loaded ``Recognizer`` serving many
connections, a ``Stream`` each, stepped together as one batch.

``protocol`` (what clients send and get: sherpa-onnx's streaming protocol), ``session`` (one connection's audio and
outgoing messages), ``stepper`` (the batched stepping in a worker thread), ``server`` (the aiohttp application,
graceful shutdown) and ``static/`` (the microphone page). Needs the ``serve`` extra (aiohttp); ``import
ssm_fairseq.serve`` alone imports nothing.
"""
