"""Serving models: the ``serve`` job's spec, the dashboard's client of its OpenAI-compatible API, and the
endpoint record it writes. Nothing here imports the ML stack (the worker side is ``worker/serve.py``)."""
