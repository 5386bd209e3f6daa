"""``cxrground serve``: the HTTP API, the OpenAI-compatible endpoint and the web demo for a checkpoint."""

from __future__ import annotations

import click

from cxrground.cli.common import CleanCommand, note, request_options, threads_option, warn
from cxrground.serve.request import ServeRequest, serve_request


@click.command("serve", cls=CleanCommand)
@threads_option
@request_options(ServeRequest)
def serve(request: ServeRequest) -> None:
    """Serve a checkpoint over HTTP: POST /v1/segment, POST /v1/chat/completions (OpenAI), web page at /."""
    serve_request(request, warn=warn, note=note)


COMMANDS: list[click.Command] = [serve]
