"""``cxrground serve``: the HTTP API, the OpenAI-compatible endpoint and the web demo for a checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import EXISTING


@click.command("serve")
@click.option("--checkpoint", type=EXISTING, required=True,
              help="Checkpoint folder (checkpoint.json names the backend).")
@click.option("--host", default="127.0.0.1",
              help="Address to bind; anything but loopback exposes the server to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000)
@click.option("--device", default="cpu", help="Device for the model (cpu, cuda, cuda:1 ...).")
@click.option("--max-upload-mb", type=click.FloatRange(min=0, min_open=True), default=32.0,
              help="Largest image accepted, in MiB (413 beyond).")
@click.option("--max-pixels", type=click.IntRange(min=1), default=40_000_000,
              help="Largest image accepted, in pixels (413 beyond).")
@click.option("--workers", type=click.IntRange(min=1), default=1,
              help="Server processes, each with its own copy of the model.")
@click.option("--api-key-env", metavar="NAME", default=None,
              help="Require the API key held by environment variable NAME on every route but /health "
                   "('Authorization: Bearer KEY' or 'api-key: KEY').")
@click.option("--cors-origin", "cors_origins", metavar="ORIGIN", multiple=True,
              help="Allow cross-origin browser calls from ORIGIN (repeatable; CORS is off without it).")
def serve(checkpoint: Path, host: str, port: int, device: str, max_upload_mb: float, max_pixels: int,
          workers: int, api_key_env: str | None, cors_origins: tuple[str, ...]) -> None:
    """Serve a checkpoint over HTTP: POST /v1/segment, POST /v1/chat/completions (OpenAI), web page at /."""
    try:
        from cxrground.serve.access import AccessPolicy, read_api_key
        from cxrground.serve.limits import Limits
        from cxrground.serve.run import is_loopback
        from cxrground.serve.run import serve as run_server
    except ImportError as exc:
        raise click.ClickException(f"serving needs the 'serve' extra (pip install 'cxrground[serve]'): {exc}") from exc
    key = read_api_key(api_key_env) if api_key_env else None
    access = AccessPolicy(api_key=key, api_key_env=api_key_env, cors_origins=cors_origins)
    if not is_loopback(host) and key is None:
        click.secho(f"warning: binding to {host} exposes the server beyond this machine; it has no "
                    "authentication (see --api-key-env). Put it behind an authenticating proxy.", fg="yellow", err=True)
    limits = Limits(max_upload_bytes=int(max_upload_mb * 1024 * 1024), max_pixels=max_pixels)
    click.echo(f"serving {checkpoint} on http://{host}:{port}/ (web page), /v1/segment, /v1/chat/completions", err=True)
    run_server(checkpoint, host=host, port=port, device=device, limits=limits, access=access, workers=workers)


COMMANDS: list[click.Command] = [serve]
