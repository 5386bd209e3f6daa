"""``cxrground ils convert-lisa``: a released LISA / ROSALIA checkpoint folder → a cxrground LISA checkpoint.

The command is added to the ``ils`` group at import time; ``COMMANDS`` is empty because the group itself is
registered by :mod:`cxrground.cli.ils_cmds`. ``torch``/``transformers`` are imported only when it runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.ils_cmds import ils
from cxrground.errors import CXRGroundError


@click.command("convert-lisa")
@click.option("--source", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="Local folder in the released layout (xinlai/LISA-7B-v1, checkone/ROSALIA-7B-v1).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Checkpoint folder to write (checkpoint.json + model.safetensors + tokenizer).")
@click.option("--sam", type=click.Path(path_type=Path, exists=True), default=None,
              help="SAM weights when the source has none: sam_vit_h_4b8939.pth or a transformers SAM folder.")
@click.option("--clip", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Local CLIP ViT-L/14 folder: its config, and its weights when the source does not store the "
                   "vision tower.")
@click.option("--tokenizer", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Tokenizer folder (default: the source folder).")
@click.option("--allow-missing", multiple=True, type=click.Choice(["text_hidden_fcs", "visual_model.mask_decoder"]),
              help="Parts that may stay at their initialisation (e.g. starting from a plain LLaVA).")
@click.option("--dtype", type=click.Choice(["source", "float32", "bfloat16", "float16"]), default="source",
              show_default=True, help="Dtype of the written weights (source = keep the release's, e.g. bf16).")
def convert_lisa(source: Path, out: Path, sam: Path | None, clip: Path | None, tokenizer: Path | None,
                 allow_missing: tuple[str, ...], dtype: str) -> None:
    """Map every weight of a released LISA/ROSALIA checkpoint onto the cxrground LISA model and save it."""
    from cxrground.models.lisa.convert import convert_released

    try:
        path = convert_released(source, out, sam=sam, clip=clip, tokenizer=tokenizer, allow_missing=allow_missing,
                                dtype=dtype)
    except CXRGroundError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {path}")


ils.add_command(convert_lisa)

COMMANDS: list[click.Command] = []
