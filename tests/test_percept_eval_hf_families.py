"""``hf:FOLDER`` on tiny random VLMs of the families people benchmark, each through a 7-image RR conversation.

Families (``cxrground.testing.vlm_families``): Qwen2-VL and Qwen2.5-VL (image tokens depend on the image size),
Gemma 3 / MedGemma, Idefics3 and SmolVLM (tiles + global view), InternVL (transformers layout). Every model folder
is built offline with the family's real classes. The RR case's 7 images are given different sizes (multiples of 28), so
each family's processor must expand every image into its own token count; the count in each of the 9 requests
is checked against the family's rule computed from the sizes alone. Without torchvision (this project's test
environment), Qwen, InternVL and SmolVLM load through the image-only processor of
:func:`~cxrground.evaluation.percept.clients.hf.load_processor`.
"""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from click.testing import CliRunner  # noqa: E402
from PIL import Image  # noqa: E402

from cxrground.cli import main  # noqa: E402
from cxrground.evaluation.percept.clients.hf import HFClient, load_processor, to_hf_messages  # noqa: E402
from cxrground.evaluation.percept.conversation import Conversation, plan_benchmark  # noqa: E402
from cxrground.percept.schema import load_benchmark  # noqa: E402
from cxrground.testing.mock_bench import make_benchmark  # noqa: E402
from cxrground.testing.vlm_families import FAMILIES  # noqa: E402

MAX_TOKENS = 3
#: Sizes (h, w) given to the RR case's images in the order the conversation first shows them.
SIZES = [(56, 56), (84, 56), (28, 112), (56, 84), (112, 112), (28, 28), (84, 84)]


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",))


def _sized_urls(root: Path):
    """``image_url`` for a Conversation: each new image re-encoded at the next of :data:`SIZES`; returns (fn, sizes)."""
    sizes: dict[str, tuple[int, int]] = {}

    def url(rel: str) -> str:
        if rel not in sizes:
            sizes[rel] = SIZES[len(sizes) % len(SIZES)]
        h, w = sizes[rel]
        with Image.open(root / rel) as im:
            resized = im.convert("RGB").resize((w, h), Image.Resampling.NEAREST)
        buf = io.BytesIO()
        resized.save(buf, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    return url, sizes


def _image_sizes(messages) -> list[tuple[int, int]]:
    out = []
    for m in to_hf_messages(messages):
        for p in m["content"]:
            if p["type"] == "image":
                out.append((p["image"].height, p["image"].width))
    return out


_FOLDERS: dict[str, Path] = {}


def _folder(family: str, tmp_path_factory) -> Path:
    if family not in _FOLDERS:
        build, _ = FAMILIES[family]
        _FOLDERS[family] = build(tmp_path_factory.mktemp(family.replace(".", "_")))
    return _FOLDERS[family]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rr_conversation_with_seven_images_of_different_sizes(family, bench, tmp_path_factory, monkeypatch):
    if family == "smolvlm":
        pytest.importorskip("num2words", reason="transformers' SmolVLM processor needs num2words (the vlm extra)")
    folder = _folder(family, tmp_path_factory)
    _, expected_tokens = FAMILIES[family]
    loaded = load_benchmark(bench)
    rr = next(p for p in plan_benchmark(loaded) if p.path == "RR")
    url, sizes = _sized_urls(loaded.root)
    conv = Conversation(rr, "none", url)
    client = HFClient(str(folder), max_tokens=MAX_TOKENS, device="cpu")
    processor, model = client._load()
    assert model.device.type == "cpu" and model.dtype == torch.float32
    token_id = getattr(model.config, "image_token_id", None) or model.config.image_token_index
    seen: list[tuple[int, int]] = []  # (image tokens, prompt length) per request
    render = processor.apply_chat_template

    def spy(*args, **kwargs):
        out = render(*args, **kwargs)
        seen.append((int((out["input_ids"] == token_id).sum()), int(out["input_ids"].shape[1])))
        return out

    monkeypatch.setattr(processor, "apply_chat_template", spy)

    async def run():
        done = []
        while not conv.done:
            messages = conv.next_request()
            completion = await client.complete(messages, conv.current, rr.case_id)
            done.append((_image_sizes(messages), completion))
            conv.record(completion.content, False)
        await client.aclose()
        return done

    done = asyncio.run(run())
    assert len(done) == len(rr.questions) == len(seen) == 9
    assert max(len(s) for s, _ in done) == 7 and len(set(sizes.values())) == 7
    previous = 0
    for (shown, completion), (image_tokens, length) in zip(done, seen, strict=True):
        assert image_tokens == expected_tokens(shown) > 0
        assert isinstance(completion.content, str) and completion.content
        assert completion.usage == {"prompt_tokens": length, "completion_tokens": MAX_TOKENS}
        assert length > previous
        previous = length
    if family.startswith("qwen"):  # the token count follows the image size: 7 images of 7 sizes, 7 counts
        last = done[-1][0]
        assert len({expected_tokens([s]) for s in last}) >= 5


def test_image_only_processor_is_used_only_without_torchvision(tmp_path_factory):
    import importlib.util

    folder = _folder("qwen2-vl", tmp_path_factory)
    processor = load_processor(str(folder))
    has_torchvision = importlib.util.find_spec("torchvision") is not None
    assert (type(processor).__name__ == "ImageOnlyProcessor") is (not has_torchvision)
    if not has_torchvision:  # a video request names what is missing
        with pytest.raises(AttributeError, match="torchvision"):
            processor.video_processor.preprocess  # noqa: B018


def test_cli_eval_on_qwen2_vl(bench, tmp_path, tmp_path_factory):
    folder = _folder("qwen2-vl", tmp_path_factory)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", f"hf:{folder}", "--out",
                                    str(out), "--oracle", "none", "--max-tokens", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "3 of 3 cases run (0 failed)" in res.output
    import json

    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["path"] for r in records) == ["LF", "RF", "RR"]
    assert all(r["status"] == "ok" for r in records)
    assert sum(len(r["questions"]) for r in records) == 1 + 6 + 9


def test_sizes_are_distinct_multiples_of_28():
    assert all(h % 28 == 0 and w % 28 == 0 for h, w in SIZES) and len(set(SIZES)) == len(SIZES)
    assert np.prod(max(SIZES, key=np.prod)) <= 112 * 112  # inside the tiny Qwen's max_pixels: no resize
