"""The OpenAI-compatible ``POST /v1/chat/completions`` endpoint's input and output rules.

Request (OpenAI wire format):

* ``messages``: each ``{"role", "content"}`` with ``content`` a string or a list of parts
  ``{"type": "text", "text": ...}`` / ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``
  (``image_url`` may also be the URL string itself).
* The input is the **last user message**: its text parts, joined by a newline, are the instruction,
  and its image is the image. When the last user message has text only, the most recent image of
  an earlier user message is used (a follow-up question about the same image). Exactly one image
  is used: more than one image in the last user message, or no image at all, is a 400.
* Images must be ``data:`` URLs (base64); ``http(s)://`` URLs are refused with 400 (remote URLs are
  not fetched) and so are file-system paths.
* ``stream: true`` is refused with 400 (streaming is not supported: an answer is one short sentence
  produced at once); ``n`` other than 1 is refused with 400. So is every request for what the answer cannot be:
  ``response_format`` other than ``text`` (JSON output), ``logprobs`` / ``top_logprobs``, and ``tool_choice``
  ``required`` or naming a function; the error's ``param`` names the field. ``max_tokens`` (or
  ``max_completion_tokens``) below the answer's length cuts the answer to that many whitespace tokens with
  ``finish_reason: "length"``. ``model`` may name any model: the server answers with the one it serves and says
  so in the response's ``model`` field. ``temperature``, ``seed``, ``stop``, ``top_p`` and the like are accepted and
  have no effect (the answer is deterministic).

Response: a standard ``chat.completion`` object — ``id`` (``chatcmpl-…``), ``object``, ``created``,
``model``, ``choices[0].message = {"role": "assistant", "content": <answer text>}``,
``finish_reason: "stop"`` — whose ``usage`` counts **whitespace-separated tokens**:
``prompt_tokens`` = words of the instruction text (the image is not counted), ``completion_tokens`` =
words of the answer; the model's own tokenizer is not used. One extra top-level field carries the
grounding result::

    "cxrground": {"structured": {...IlsOutput.structured()...},
                  "mask": {"size": [H, W], "counts": "<COCO RLE>"},
                  "image_size": [H, W]}

The official ``openai`` client exposes it as ``completion.model_extra["cxrground"]`` (or
``completion.to_dict()["cxrground"]``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from cxrground.serve.limits import ApiError, Limits
from cxrground.serve.schemas import ChatCompletionRequest, ChatMessage

__all__ = ["chat_input", "completion_body", "max_tokens_of", "whitespace_tokens"]


def whitespace_tokens(text: str) -> int:
    """Number of whitespace-separated tokens (the ``usage`` unit of this server)."""
    return len(text.split())


def chat_input(request: ChatCompletionRequest, limits: Limits) -> tuple[str, str]:
    """``(image_url, instruction)`` taken from the messages per the rules in the module docstring."""
    if request.stream:
        raise ApiError(400, "invalid_request", "stream=true is not supported by this server; send stream=false",
                       param="stream")
    if request.n not in (None, 1):
        raise ApiError(400, "invalid_request", f"n={request.n} is not supported; this server returns one choice",
                       param="n")
    _refuse_unmet(request.model_extra or {})
    if len(request.messages) > limits.max_messages:
        raise ApiError(400, "invalid_request",
                       f"{len(request.messages)} messages; the limit is {limits.max_messages}")
    users = [m for m in request.messages if m.role == "user"]
    if not users:
        raise ApiError(400, "invalid_request", "no user message: send the image and the instruction as a user message")
    texts, images = _parts(users[-1])
    instruction = "\n".join(t for t in texts if t.strip()).strip()
    if not instruction:
        raise ApiError(400, "invalid_request", "the last user message has no instruction text")
    if len(images) > 1:
        raise ApiError(400, "invalid_request",
                       f"the last user message has {len(images)} images; exactly one image is supported")
    if not images:
        for earlier in reversed(users[:-1]):
            images = _parts(earlier)[1][-1:]
            if images:
                break
    if not images:
        raise ApiError(400, "invalid_request",
                       "no image: add an image_url part with a data URL (data:image/png;base64,...)")
    return images[0], instruction


def _refuse_unmet(fields: dict[str, Any]) -> None:
    """400 for a request field that asks for an answer this server cannot give (module docstring)."""
    fmt = fields.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if fmt is not None and kind != "text":
        raise ApiError(400, "invalid_request", f"response_format {kind!r} is not supported: the answer is the "
                       "model's templated sentence (with its mask in the cxrground field)", param="response_format")
    for name in ("logprobs", "top_logprobs"):
        if fields.get(name):
            raise ApiError(400, "invalid_request", f"{name} is not supported by this server", param=name)
    choice = fields.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        raise ApiError(400, "invalid_request", "this server calls no tools; tool_choice must be 'none' or 'auto'",
                       param="tool_choice")
    for name in ("max_tokens", "max_completion_tokens"):
        value = fields.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ApiError(400, "invalid_request", f"{name} must be a positive integer", param=name)


def completion_body(model_id: str, answer: str, instruction: str, extra: dict[str, Any],
                    max_tokens: int | None = None) -> dict[str, Any]:
    """The ``chat.completion`` JSON for one answer, with ``extra`` as the ``cxrground`` field; an answer longer than
    ``max_tokens`` whitespace tokens is cut to them with ``finish_reason: "length"``."""
    finish = "stop"
    if max_tokens is not None and whitespace_tokens(answer) > max_tokens:
        answer, finish = " ".join(answer.split()[:max_tokens]), "length"
    prompt_tokens = whitespace_tokens(instruction)
    completion_tokens = whitespace_tokens(answer)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_id,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": answer},
            "finish_reason": finish,
            "logprobs": None,
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "cxrground": extra,
    }


def _parts(message: ChatMessage) -> tuple[list[str], list[str]]:
    """Text parts and image URLs of one message."""
    content = message.content
    if content is None:
        return [], []
    if isinstance(content, str):
        return [content], []
    texts: list[str] = []
    images: list[str] = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise ApiError(400, "invalid_request", f"content part {i} of type text has no text string")
            texts.append(text)
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str) or not url:
                raise ApiError(400, "invalid_request", f"content part {i} of type image_url has no url")
            images.append(url)
        else:
            raise ApiError(400, "invalid_request",
                           f"content part {i} has type {kind!r}; only 'text' and 'image_url' are supported")
    return texts, images


def max_tokens_of(request: ChatCompletionRequest) -> int | None:
    """The request's ``max_completion_tokens`` or else ``max_tokens`` (None: no limit)."""
    fields = request.model_extra or {}
    value = fields.get("max_completion_tokens", fields.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None
