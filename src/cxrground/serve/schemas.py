"""Request and response bodies of the HTTP API (pydantic; they also make the OpenAPI document)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatCompletion",
    "ChatCompletionRequest",
    "ChatMessage",
    "ErrorResponse",
    "MaskFormat",
    "RleMask",
    "SegmentRequest",
    "SegmentResponse",
]

MaskFormat = Literal["rle", "png", "both"]


class SegmentRequest(BaseModel):
    """JSON form of ``POST /v1/segment`` (the multipart form has the same fields, ``image`` as a file)."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(description="The image as base64 or a data URL (PNG, JPEG, 16-bit PNG or DICOM).")
    instruction: str = Field(description="An ILS instruction, e.g. 'Segment the effusion.'")
    mask_format: MaskFormat = Field("both", description="rle, png or both.")
    overlay: bool = Field(False, description="Also return the mask blended onto the image (overlay_png).")
    include_image: bool = Field(False, description="Also return the 8-bit grey image the model saw (image_png).")


class RleMask(BaseModel):
    """COCO RLE at the image's native size (column-major, compressed counts string)."""

    size: list[int]
    counts: str


class ModelInfo(BaseModel):
    """Which model answered."""

    name: str
    checkpoint: str | None = None


class SegmentResponse(BaseModel):
    """Answer of ``POST /v1/segment``."""

    answer: str
    structured: dict[str, Any] = Field(description="IlsOutput.structured(): lesion, locations, instruction_type, "
                                                   "present, presence_probability, certainty.")
    mask: RleMask | None = Field(None, description="COCO RLE, native size (mask_format rle or both).")
    mask_png: str | None = Field(None, description="base64 PNG, 0/255, native size (mask_format png or both).")
    overlay_png: str | None = Field(None, description="base64 RGB PNG of the mask blended onto the image.")
    image_png: str | None = Field(None, description="base64 8-bit grey PNG of the image as the model saw it.")
    image_size: list[int] = Field(description="[H, W].")
    mask_pixels: int
    model: ModelInfo
    timing_ms: dict[str, float]


class ErrorDetail(BaseModel):
    """What went wrong."""

    type: str
    message: str
    code: str | None = None
    param: str | None = None


class ErrorResponse(BaseModel):
    """Every error answer: ``{"error": {"type", "message", ...}}``."""

    error: ErrorDetail


class ChatMessage(BaseModel):
    """One OpenAI chat message; ``content`` is a string or a list of ``text`` / ``image_url`` parts."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(BaseModel):
    """The subset of the OpenAI chat-completions request the server reads; other fields are ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    n: int | None = 1


class ChatCompletion(BaseModel):
    """A standard ``chat.completion`` object plus the ``cxrground`` extra field."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: dict[str, int]
    cxrground: dict[str, Any]
