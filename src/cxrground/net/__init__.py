"""Network plumbing shared by the HTTP servers (``cxrground serve``, ``cxrground review serve``): connection-level
defences against idle and hostile clients (:mod:`.connections`). Needs uvicorn and starlette (the ``serve`` extra)."""
