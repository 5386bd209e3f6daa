"""``cxrground serve``: the HTTP API (FastAPI), its OpenAI-compatible endpoint and the web demo.

Import :func:`cxrground.serve.app.create_app` to build the app for a loaded model, or
:func:`cxrground.serve.run.serve` to load a checkpoint and run uvicorn. FastAPI and uvicorn are
imported by those modules only (the ``serve`` extra), never at package import time.
"""
