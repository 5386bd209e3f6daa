"""Converting a released LISA/ROSALIA checkpoint as a request (:class:`ConvertRequest`) and :func:`convert_request`.

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground ils convert-lisa`` offers one option per
field. The converter (:mod:`.convert`, torch) is imported when a conversion runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cxrground.fields import option

__all__ = ["ConvertRequest", "convert_request"]


@dataclass(frozen=True, kw_only=True)
class ConvertRequest:
    """The released folder, the checkpoint folder to write, the parts to take from elsewhere or leave out, the
    weights' dtype."""

    source: Path = option(path="dir", help="Local folder in the released layout (xinlai/LISA-7B-v1, "
                          "checkone/ROSALIA-7B-v1).")
    out: Path = option(path="out_dir",
                       help="Checkpoint folder to write (checkpoint.json + model.safetensors + tokenizer).")
    sam: Path | None = option(None, path="existing", help="SAM weights when the source has none: "
                              "sam_vit_h_4b8939.pth or a transformers SAM folder.")
    clip: Path | None = option(None, path="dir", help="Local CLIP ViT-L/14 folder: its config, and its weights when "
                               "the source does not store the vision tower.")
    tokenizer: Path | None = option(None, path="dir", help="Tokenizer folder (default: the source folder).")
    allow_missing: tuple[str, ...] = option((), choices=("text_hidden_fcs", "visual_model.mask_decoder"),
                                            help="Parts that may stay at their initialisation (e.g. starting from a "
                                                 "plain LLaVA).")
    dtype: str = option("source", choices=("source", "float32", "bfloat16", "float16"),
                        help="Dtype of the written weights (source = keep the release's, e.g. bf16).")


def convert_request(request: ConvertRequest) -> Path:
    """Map every weight of the released checkpoint onto the cxrground LISA model and save it; returns its folder."""
    from cxrground.models.base import check_checkpoint_folder
    from cxrground.models.lisa.convert import convert_released

    r = request
    check_checkpoint_folder(r.out, "lisa")
    return convert_released(r.source, r.out, sam=r.sam, clip=r.clip, tokenizer=r.tokenizer,
                            allow_missing=r.allow_missing, dtype=r.dtype)
