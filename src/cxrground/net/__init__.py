"""Network plumbing shared by the HTTP servers (``cxrground serve``, ``cxrground review serve``): connection-level
defences against idle and hostile clients (:mod:`.connections`, which needs uvicorn and starlette, the ``serve``
extra) and their limits, defaults and option checks (:mod:`.limits`, standard library only)."""
