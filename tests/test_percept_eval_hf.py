"""The ``hf:MODEL_DIR`` client end to end on a tiny random LLaVA built offline (CPU, nothing downloaded).

The model folder is made here with transformers: a 1-layer CLIP vision tower on 16×16 images (patch 8 →
4 tokens per image after the CLS token is dropped), a 1-layer Llama, a byte-level BPE tokenizer trained on
the CheXpercept templates with ``<image>`` special, and a small Jinja chat template. Its generation config
suppresses EOS and every token with a digit or ``<`` in it, so each reply is exactly ``max_tokens`` tokens
of digit-free gibberish: unparseable, hence wrong.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from click.testing import CliRunner  # noqa: E402

from cxrground.cli import main  # noqa: E402
from cxrground.errors import ConfigError  # noqa: E402
from cxrground.evaluation.percept.clients import make_client  # noqa: E402
from cxrground.evaluation.percept.clients.hf import EXPLICIT_GENERATION, HFClient  # noqa: E402
from cxrground.evaluation.percept.conversation import Conversation, image_data_url, plan_benchmark  # noqa: E402
from cxrground.percept.schema import load_benchmark  # noqa: E402
from cxrground.testing.mock_bench import make_benchmark  # noqa: E402
from cxrground.testing.vlm_families import chat_tokenizer  # noqa: E402

IMAGE_SIZE, PATCH = 16, 8
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH) ** 2  # CLS dropped ("default" feature selection)
MAX_TOKENS = 8

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ message['role'] | upper }}: "
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- elif part['type'] == 'image' -%}<image>{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}ASSISTANT:{%- endif -%}"
)


def _tokenizer():
    return chat_tokenizer(["<image>"], {"image_token": "<image>"}, roles="USER: ASSISTANT: SYSTEM:")


def build_tiny_llava(folder: Path) -> Path:
    """Save a random tiny LLaVA (model + processor with chat template) to ``folder``."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = _tokenizer()
    image_processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                         crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=PATCH,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=CHAT_TEMPLATE)
    vision = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=PATCH, hidden_size=16, intermediate_size=32,
                              num_hidden_layers=1, num_attention_heads=2, projection_dim=16)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1 << 15,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                         image_seq_length=TOKENS_PER_IMAGE, vision_feature_select_strategy="default",
                         vision_feature_layer=-1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlavaForConditionalGeneration(config).eval()
    gen = model.generation_config
    gen.pad_token_id = tok.pad_token_id
    gen.suppress_tokens = [i for i in range(len(tok))
                           if i in tok.all_special_ids or any(c.isdigit() or c == "<" for c in tok.decode([i]))]
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny_llava"))


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",))


def _image_parts(messages) -> int:
    return sum(1 for m in messages if isinstance(m["content"], list)
               for p in m["content"] if p.get("type") == "image_url")


def test_multi_image_conversation(llava, bench, monkeypatch):
    loaded = load_benchmark(bench)
    rr = next(p for p in plan_benchmark(loaded) if p.path == "RR")
    assert rr.total_images == 7
    conv = Conversation(rr, "none", lambda rel: image_data_url(loaded.root / rel))
    client = HFClient(str(llava), max_tokens=MAX_TOKENS)
    processor, model = client._load()
    assert model.device.type == "cpu" and model.dtype == torch.float32
    seen: list[tuple[int, int, int]] = []  # (images in the batch, <image> tokens, prompt length)
    render = processor.apply_chat_template

    def spy(*args, **kwargs):
        out = render(*args, **kwargs)
        ids = out["input_ids"]
        seen.append((int(out["pixel_values"].shape[0]), int((ids == processor.image_token_id).sum()),
                     int(ids.shape[1])))
        return out

    monkeypatch.setattr(processor, "apply_chat_template", spy)

    async def run() -> list[tuple[int, object]]:
        done = []
        while not conv.done:
            messages = conv.next_request()
            completion = await client.complete(messages, conv.current, rr.case_id)
            done.append((_image_parts(messages), completion))
            conv.record(completion.content, False)
        await client.aclose()
        return done

    done = asyncio.run(run())
    assert len(done) == len(rr.questions) == len(seen) == 9
    assert client._loaded is None  # aclose drops the model
    assert max(n for n, _ in done) == 7
    previous = 0
    for (n_images, completion), (batch_images, image_tokens, length) in zip(done, seen, strict=True):
        assert batch_images == n_images and image_tokens == TOKENS_PER_IMAGE * n_images
        assert isinstance(completion.content, str) and completion.content.strip()
        assert not any(c.isdigit() for c in completion.content)
        assert completion.usage == {"prompt_tokens": length, "completion_tokens": MAX_TOKENS}
        assert length > previous  # the history grows turn by turn
        previous = length
        assert completion.model_version == str(llava)


def test_sampling_and_top_p(llava, bench):
    loaded = load_benchmark(bench)
    plan = next(p for p in plan_benchmark(loaded) if p.path == "LF")
    conv = Conversation(plan, "none", lambda rel: image_data_url(loaded.root / rel))
    client = make_client(f"hf:{llava}", temperature=0.7, top_p=0.9, max_tokens=3, seed=0)
    # --sampling-params explicit (default): the model's own generation settings are overridden, top_p given
    assert client.decoding == {"temperature": 0.7, "max_tokens": 3, **EXPLICIT_GENERATION, "top_p": 0.9}
    messages = conv.next_request()
    completion = asyncio.run(client.complete(messages))
    assert isinstance(completion.content, str) and completion.usage["completion_tokens"] == 3
    # a sample's seed makes it reproducible, other seeds sample anew, and torch's global state is left alone
    state = torch.random.get_rng_state()
    texts = [asyncio.run(client.complete(messages, seed=s)).content for s in (5, 5, 6, 7, 8)]
    assert torch.equal(state, torch.random.get_rng_state())
    assert texts[0] == texts[1] and len(set(texts[1:])) > 1


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


def test_cli_eval_rerun_from_cache_and_score(llava, bench, tmp_path, monkeypatch):
    calls: list[int] = []
    generate = HFClient._generate

    def counting(self, messages):
        calls.append(_image_parts(messages))
        return generate(self, messages)

    monkeypatch.setattr(HFClient, "_generate", counting)
    runner = CliRunner()

    def evaluate(out: Path, oracle: str = "none"):
        return runner.invoke(main, ["percept", "eval", "--bench", str(bench), "--model", f"hf:{llava}", "--out",
                                    str(out), "--oracle", oracle, "--max-tokens", str(MAX_TOKENS), "--no-progress"])

    first = tmp_path / "runs" / "a"
    res = evaluate(first)
    assert res.exit_code == 0, res.output
    assert "3 of 3 cases run (0 failed)" in res.output
    records = _records(first)
    assert sorted(r["path"] for r in records) == ["LF", "RF", "RR"]
    questions = [q for r in records for q in r["questions"]]
    assert all(r["status"] == "ok" and r["error"] is None for r in records)
    assert len(calls) == len(questions) == 1 + 6 + 9 and max(calls) == 7
    for q in questions:  # every turn asked and answered; the gibberish is unparseable, hence wrong
        assert isinstance(q["raw"], str) and q["raw"]
        assert q["label"] == "unparseable" and q["correct"] is False and q["cached"] is False
        assert q["usage"]["completion_tokens"] == MAX_TOKENS
    usage = json.loads((first / "usage.json").read_text())
    assert usage["kind"] == "hf" and usage["requests_sent"] == len(questions) and usage["cache_hits"] == 0
    assert usage["tokens"]["completion_tokens"] == MAX_TOKENS * len(questions)
    assert usage["model_versions"] == [str(llava)]

    # same command again: nothing left to run
    res = evaluate(first)
    assert res.exit_code == 0, res.output
    assert "0 of 3 cases run" in res.output and len(calls) == len(questions)
    # a sibling run shares percept_cache.sqlite: every request is served from the cache, the model never runs
    second = tmp_path / "runs" / "b"
    res = evaluate(second)
    assert res.exit_code == 0, res.output
    assert len(calls) == len(questions)
    again = json.loads((second / "usage.json").read_text())
    assert again["requests_sent"] == 0 and again["cache_hits"] == len(questions)
    raw = lambda run: {r["case_id"]: [q["raw"] for q in r["questions"]] for r in _records(run)}  # noqa: E731
    assert raw(second) == raw(first)
    assert all(q["cached"] for r in _records(second) for q in r["questions"])
    # another oracle setting reuses Stage 1 (the first request of every case) from the cache
    res = evaluate(tmp_path / "runs" / "c", oracle="implicit")
    assert res.exit_code == 0, res.output
    third = _records(tmp_path / "runs" / "c")
    assert all(r["questions"][0]["cached"] for r in third)
    assert len(calls) - len(questions) == sum(not q["cached"] for r in third for q in r["questions"]) > 0

    res = runner.invoke(main, ["percept", "score", str(first), "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    score = json.loads((first / "score.json").read_text())
    assert score["parse"]["overall"]["n"] == len(questions) and score["parse"]["overall"]["unparseable"] == 1.0
    assert set(score["paths"]) == {"RR", "RF", "LF"}
    assert all(b["oracle_passed"]["stage1"]["acc"] == 0.0 for b in score["paths"].values())
    assert score["run"]["model"] == f"hf:{llava}"


def test_not_a_model_folder_is_a_clear_error(llava, bench, tmp_path):
    runner = CliRunner()

    def evaluate(folder: Path, out: str):
        return runner.invoke(main, ["percept", "eval", "--bench", str(bench), "--model", f"hf:{folder}", "--out",
                                    str(tmp_path / out), "--oracle", "none", "--max-tokens", "4", "--no-progress"])

    res = evaluate(tmp_path / "missing", "r0")
    assert res.exit_code != 0 and "hf model folder not found" in res.output

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("not a model")
    with pytest.raises(ConfigError, match="not a transformers model folder"):
        make_client(f"hf:{empty}")
    res = evaluate(empty, "r1")
    assert res.exit_code != 0 and "not a transformers model folder" in res.output

    # a text-only model: config.json and a tokenizer, but no image-text-to-text architecture
    from transformers import AutoTokenizer, LlamaConfig

    text_only = tmp_path / "text_only"
    AutoTokenizer.from_pretrained(llava, local_files_only=True).save_pretrained(text_only)
    LlamaConfig(vocab_size=400, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(text_only)
    with pytest.raises(ConfigError, match=r"cannot load .* as a transformers chat VLM"):
        asyncio.run(HFClient(str(text_only)).complete([{"role": "user", "content": "hi"}]))
    res = evaluate(text_only, "r2")
    assert res.exit_code != 0 and "cannot load" in res.output, res.output
    results = tmp_path / "r2" / "results.jsonl"  # the run stops; no case is recorded as failed
    assert not results.is_file() or results.read_text() == ""
