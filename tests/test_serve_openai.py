"""The OpenAI-compatible endpoint, called with the official ``openai`` Python client."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from cxrground.io.masks import decode_rle  # noqa: E402
from cxrground.serve.app import create_app  # noqa: E402
from cxrground.serve.limits import Limits  # noqa: E402
from cxrground.serve.run import BackgroundServer  # noqa: E402
from cxrground.vocab import ils_templates  # noqa: E402
from serve_helpers import ThresholdModel, cxr_pixels, data_url, expected_output, png_bytes  # noqa: E402

INSTRUCTION = ils_templates.instruction("global", "effusion")


@pytest.fixture(scope="module")
def client():
    with BackgroundServer(create_app(ThresholdModel(), Limits(max_upload_bytes=200_000))) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)


def _user(text: str | None = INSTRUCTION, *urls: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    if text is not None:
        parts.append({"type": "text", "text": text})
    return {"role": "user", "content": parts}


def test_chat_completion_answer_and_cxrground_field(client):
    px = cxr_pixels(50, 70)
    resp = client.chat.completions.create(model="anything", messages=[_user(INSTRUCTION, data_url(png_bytes(px)))])
    want = expected_output(px, INSTRUCTION)
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert resp.model == "threshold-test"
    assert len(resp.choices) == 1
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == want.answer == "[SEG] It is located in the right lung."
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens == len(INSTRUCTION.split()) == 3
    assert resp.usage.completion_tokens == len(want.answer.split()) == 8
    assert resp.usage.total_tokens == 11
    extra = resp.model_extra["cxrground"]
    assert extra == resp.to_dict()["cxrground"]
    assert extra["image_size"] == [50, 70]
    assert extra["structured"] == want.structured()
    np.testing.assert_array_equal(decode_rle(extra["mask"], (50, 70)), want.mask)


def test_system_message_string_content_and_earlier_image(client):
    """A text-only last user turn uses the most recent image of an earlier user turn."""
    dark = np.full((30, 40), 60, np.uint8)
    px = cxr_pixels(50, 70)
    follow_up = ils_templates.instruction("basic", "edema", ["left lung base"])
    messages = [
        {"role": "system", "content": "You are a grounding model."},
        _user(INSTRUCTION, data_url(png_bytes(dark))),
        {"role": "assistant", "content": "[SEG] There is no effusion."},
        _user(INSTRUCTION, data_url(png_bytes(px))),
        {"role": "assistant", "content": "[SEG] It is located in the right lung."},
        {"role": "user", "content": follow_up},
    ]
    resp = client.chat.completions.create(model="m", messages=messages)
    assert resp.choices[0].message.content == expected_output(px, follow_up).answer
    assert resp.model_extra["cxrground"]["image_size"] == [50, 70]


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["threshold-test"]
    assert models.data[0].owned_by == "cxrground"


@pytest.mark.parametrize(("messages", "kwargs", "words"), [
    ([_user(INSTRUCTION, "https://example.org/cxr.png")], {}, "remote URLs are not fetched"),
    ([_user(INSTRUCTION, "/data/cxr.png")], {}, "file-system paths"),
    ([_user(INSTRUCTION)], {}, "no image"),
    ([{"role": "user", "content": INSTRUCTION}], {}, "no image"),
    ([_user(None, "IMG")], {}, "no instruction text"),
    ([_user(INSTRUCTION, "IMG", "IMG")], {}, "2 images"),
    ([{"role": "system", "content": INSTRUCTION}], {}, "no user message"),
    ([_user(INSTRUCTION, "IMG")], {"n": 2}, "n=2"),
    ([_user(INSTRUCTION, "IMG")], {"stream": True}, "stream=true is not supported"),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], {}, "'input_audio'"),
    ([_user(INSTRUCTION, data_url(b"\x89PNG\r\n\x1a\n" + bytes(40)))], {}, "cannot decode the PNG image"),
    ([_user(INSTRUCTION, "IMG")], {"response_format": {"type": "json_object"}}, "response_format 'json_object'"),
    ([_user(INSTRUCTION, "IMG")], {"logprobs": True}, "logprobs is not supported"),
    ([_user(INSTRUCTION, "IMG")], {"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {}}}}]}, "tool_choice must be"),
    ([_user(INSTRUCTION, "IMG")], {"max_tokens": 0}, "max_tokens must be a positive integer"),
])
def test_bad_requests_raise_bad_request_error(client, messages, kwargs, words):
    image = data_url(png_bytes(cxr_pixels()))
    for m in messages:
        if isinstance(m["content"], list):
            for part in m["content"]:
                if part.get("type") == "image_url" and part["image_url"]["url"] == "IMG":
                    part["image_url"]["url"] = image
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=messages, **kwargs)
    assert words in info.value.message
    assert info.value.status_code == 400


def test_refused_fields_are_named_in_param(client):
    image = data_url(png_bytes(cxr_pixels()))
    for kwargs, param in (({"stream": True}, "stream"), ({"n": 3}, "n"), ({"logprobs": True}, "logprobs"),
                          ({"response_format": {"type": "json_object"}}, "response_format")):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=[_user(INSTRUCTION, image)], **kwargs)
        assert info.value.body["param"] == param


def test_max_tokens_cut_the_answer_and_say_so(client):
    px = cxr_pixels(50, 70)
    messages = [_user(INSTRUCTION, data_url(png_bytes(px)))]
    cut = client.chat.completions.create(model="m", messages=messages, max_tokens=2)
    assert cut.choices[0].message.content == "[SEG] It" and cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens == 2
    whole = client.chat.completions.create(model="m", messages=messages, max_completion_tokens=50,
                                           temperature=0.7, seed=3)
    assert whole.choices[0].finish_reason == "stop" and whole.choices[0].message.content == \
        expected_output(px, INSTRUCTION).answer
    assert whole.model_extra["cxrground"] == cut.model_extra["cxrground"]  # the mask is the whole answer's


def test_model_retrieve_and_head(client):
    import httpx

    assert client.models.retrieve("threshold-test").id == "threshold-test"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    root = str(client.base_url).removesuffix("/v1/")
    for path in ("/health", "/v1/models", "/"):
        head = httpx.head(root + path, timeout=10)
        assert head.status_code == 200 and head.content == b"", path


def test_validation_error_is_400_as_openai_answers(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[])
    assert "messages" in info.value.message
    assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"] == "messages"


def test_unsupported_type_is_415(client):
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m", messages=[_user(INSTRUCTION, "data:image/gif;base64,R0lGODlh")])
    assert info.value.status_code == 415
    assert "unrecognised format" in info.value.message


def test_oversize_image_is_413(client):
    rng = np.random.default_rng(1)
    big = png_bytes(rng.integers(0, 256, (300, 300, 3), dtype=np.uint8))
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m", messages=[_user(INSTRUCTION, data_url(big))])
    assert info.value.status_code == 413
    assert "200000 bytes" in info.value.message
