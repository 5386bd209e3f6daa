"""Fidelity to the reference CheXpercept code where an outside audit found cxrground apart from it.

- raw responses keep a thinking model's reasoning that a server split off (§13.2), and the parser still reads
  the answer only (§14);
- explicit decoding settings (§17: vLLM temperature 0, top_p 1, max_tokens 8192, the rest at the reference's
  ``SamplingParams`` defaults), for ``openai:`` servers and ``hf:`` models, with the old minimal set behind
  ``--sampling-params minimal`` (old run folders and cache entries stay usable);
- negative (LF) CXRs claimed in the reference's lesion order;
- the costophrenic-angle quirk (§19.8) reachable from ``percept build``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.evaluation.percept.cache import PerceptCache, percept_cache_key
from cxrground.evaluation.percept.clients import make_client
from cxrground.evaluation.percept.conversation import Conversation, image_data_url, plan_benchmark, safe_image_path
from cxrground.evaluation.percept.parsing import parse_answer, reference_parse
from cxrground.evaluation.percept.runner import CACHE_FILE, EvalSettings, run_eval, select_cases
from cxrground.io.files import sha256_json
from cxrground.llm import ChatClient, RetryPolicy, run_sync
from cxrground.percept.schema import load_benchmark
from cxrground.testing.mock_bench import make_benchmark
from cxrground.testing.mock_server import MockServer, hash_policy

THINKING = "\nThe overlay covers 3 zones, maybe 4; option 2 looks wrong.\n"
ANSWER = "\n\nAnswer: 1"
RAW = f"<think>{THINKING}</think>{ANSWER}"


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",), seed=4)


def _reply(message: dict, model: str = "m-2026") -> httpx.Response:
    return httpx.Response(200, json={"model": model, "choices": [{"message": {"role": "assistant", **message}}],
                                     "usage": {"prompt_tokens": 5, "completion_tokens": 7}})


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


# -- 1. raw responses keep the thinking ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_chat_client_keeps_the_reasoning_a_server_split_off(field):
    chat = ChatClient("http://llm.test/v1", "m", transport=httpx.MockTransport(
        lambda request: _reply({"content": ANSWER, field: THINKING})))
    got = run_sync(chat.complete([{"role": "user", "content": "x"}]))
    assert got.content == ANSWER  # the answer alone, for callers that parse it (report structuring)
    assert got.reasoning == THINKING and got.raw == RAW


@pytest.mark.parametrize(("message", "raw"), [
    ({"content": "Answer: 2"}, "Answer: 2"),  # no reasoning: unchanged
    ({"content": "Answer: 2", "reasoning_content": None, "reasoning": ""}, "Answer: 2"),
    ({"content": None, "reasoning_content": "cut off at 3"}, "<think>cut off at 3</think>"),  # thinking hit the limit
    ({"content": None}, None),
])
def test_raw_response_forms(message, raw):
    chat = ChatClient("http://llm.test/v1", "m", transport=httpx.MockTransport(lambda request: _reply(message)))
    assert run_sync(chat.complete([{"role": "user", "content": "x"}])).raw == raw


def test_openai_client_answers_with_the_raw_response():
    client = make_client("openai:m", base_url="http://llm.test/v1", transport=httpx.MockTransport(
        lambda request: _reply({"content": ANSWER, "reasoning_content": THINKING})))
    completion = run_sync(client.complete([{"role": "user", "content": "x"}]))
    assert completion.raw == RAW and completion.usage == {"prompt_tokens": 5, "completion_tokens": 7}
    assert completion.content == ANSWER  # the answer alone; the runner scores and keeps the raw response
    assert completion.model_version == "m-2026"


def test_parser_reads_the_answer_after_the_think_block():
    # the digits of the thinking (3, 4, 2) never reach the answer; the canonical parse is the reference's
    yes_no = ("Yes", "No")
    assert reference_parse(RAW) == [1]
    assert parse_answer(RAW, yes_no, False).numbers == (1,) and parse_answer(RAW, yes_no, False).label == "parsed"
    text_answer = f"<think>{THINKING}</think>\n\nYes"
    assert parse_answer(text_answer, yes_no, False).label == "matched-by-text"
    assert parse_answer(text_answer, yes_no, False).matched == (1,)
    multi = f"<think>{THINKING}</think>Answer: 1,3"
    assert parse_answer(multi, ("red point", "blue point", "green point", "None"), True).numbers == (1, 3)
    # thinking cut off by the token limit (no answer after it): nothing extracted, hence wrong
    cut = parse_answer("<think>the mask covers 2 of 3 zones</think>", yes_no, False)
    assert cut.numbers == (-1,) and cut.label == "unparseable"


def test_eval_keeps_the_thinking_in_history_results_and_cache(bench, tmp_path):
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return _reply({"content": ANSWER, "reasoning_content": THINKING})

    def client():
        return make_client("openai:m", base_url="http://llm.test/v1", transport=httpx.MockTransport(handler))

    run = tmp_path / "runs" / "a"
    run_eval(EvalSettings(bench, "openai:m", oracle="none"), run, client=client(), progress=False)
    questions = [q for r in _records(run) for q in r["questions"]]
    assert questions and all(q["raw"] == RAW and q["numbers"] == [1] and q["label"] == "parsed" for q in questions)
    # the history re-sends the raw response, thinking included (§13.2)
    assistant = [m["content"] for b in bodies for m in b["messages"] if m["role"] == "assistant"]
    assert assistant and all(text == RAW for text in assistant)
    # the response cache stores the raw response in its usual record
    cache = PerceptCache(run.parent / CACHE_FILE)
    try:
        rows = cache.store._conn.execute("SELECT response FROM responses").fetchall()
    finally:
        cache.close()
    assert rows and all(json.loads(r[0])["content"] == RAW for r in rows)
    assert set(json.loads(rows[0][0])) == {"content", "usage", "model_version", "finish_reason"}
    # a sibling run is served from the cache with the same raw responses
    sent = len(bodies)
    run_eval(EvalSettings(bench, "openai:m", oracle="none"), tmp_path / "runs" / "b", client=client(), progress=False)
    assert len(bodies) == sent
    assert [q["raw"] for r in _records(tmp_path / "runs" / "b") for q in r["questions"]] == \
        [q["raw"] for q in questions]


# -- 2. explicit decoding -------------------------------------------------------------------------------------------


def _eval(bench: Path, out: Path, server: MockServer, *extra: str):
    return CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "openai:mock-vlm",
                                     "--base-url", server.base_url, "--out", str(out), "--no-progress", *extra])


def test_explicit_sampling_parameters_are_sent_and_recorded(bench, tmp_path):
    from cxrground.evaluation.percept.clients.openai import EXPLICIT_SAMPLING

    expected = {"temperature": 0.0, "max_tokens": 8192, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert expected == {"temperature": 0.0, "max_tokens": 8192, **EXPLICIT_SAMPLING}
    with MockServer(hash_policy(0), keep_bodies=True) as server:
        res = _eval(bench, tmp_path / "explicit", server)
        assert res.exit_code == 0, res.output
        n = server.requests
        assert n > 0 and all({k: b[k] for k in expected if k in b} == expected for b in server.bodies)
        cfg = json.loads((tmp_path / "explicit" / "config.json").read_text())["config"]
        assert cfg["client"]["decoding"] == expected and "sampling_params" not in cfg
        assert json.loads((tmp_path / "explicit" / "usage.json").read_text())["decoding"] == expected

        # an extra body overrides one value and leaves another out; --top-p sets top_p
        res = _eval(bench, tmp_path / "override", server, "--top-p", "0.95",
                    "--extra-body", '{"repetition_penalty": 1.05, "top_k": null}')
        assert res.exit_code == 0, res.output
        new = server.bodies[n:]
        assert len(new) == n  # other settings, other cache keys
        assert all(b["repetition_penalty"] == 1.05 and "top_k" not in b and b["top_p"] == 0.95 and b["min_p"] == 0.0
                   for b in new)

        # minimal: temperature and the token limit only (hosted APIs), as every run sent before the option
        res = _eval(bench, tmp_path / "minimal", server, "--sampling-params", "minimal", "--temperature", "1.0",
                    "--extra-body", '{"reasoning_effort": "medium", "max_completion_tokens": 8192, "max_tokens": null}')
        assert res.exit_code == 0, res.output
        new = server.bodies[2 * n:]
        assert len(new) == n
        keys = {"model", "messages", "temperature", "seed", "reasoning_effort", "max_completion_tokens"}
        assert all(set(b) == keys and b["temperature"] == 1.0 for b in new)
        usage = json.loads((tmp_path / "minimal" / "usage.json").read_text())
        assert usage["decoding"] == {"temperature": 1.0, "reasoning_effort": "medium", "max_completion_tokens": 8192}

    res = _eval(bench, tmp_path / "bad", server, "--sampling-params", "vllm")
    assert res.exit_code != 0 and "sampling-params" in res.output


def test_a_run_folder_and_cache_of_an_earlier_version_resume_with_minimal(bench, tmp_path):
    """Before the option existed the client sent ``{temperature, max_tokens}``: that run's configuration, its cache
    keys and its stored records are what ``--sampling-params minimal`` produces and reads."""
    with MockServer(hash_policy(0), keep_bodies=True) as server:
        res = _eval(bench, tmp_path / "runs" / "old", server, "--sampling-params", "minimal", "--limit", "1")
        assert res.exit_code == 0, res.output
        cfg = json.loads((tmp_path / "runs" / "old" / "config.json").read_text())
        assert cfg["config"]["client"]["decoding"] == {"temperature": 0.0, "max_tokens": 8192}
        assert "sampling_params" not in cfg["config"] and cfg["config_sha256"] == sha256_json(cfg["config"])
        sent = server.requests
        # a default (explicit) run into that folder is another configuration
        res = _eval(bench, tmp_path / "runs" / "old", server)
        assert res.exit_code == 1 and "different configuration" in res.output and "client" in res.output
        assert "client.decoding.top_p unset then, 1.0 now" in " ".join(res.output.split()), res.output
        assert server.requests == sent

    # an old-format cache record under the key of the minimal settings is served as it is
    loaded = load_benchmark(bench)
    plan = select_cases(plan_benchmark(loaded), seed=0, limit=1)[0]  # the case a --limit 1 run asks
    conv = Conversation(plan, "none", lambda rel: image_data_url(safe_image_path(loaded.root, rel)))
    messages = conv.next_request()
    cache_file = tmp_path / "other" / CACHE_FILE
    cache = PerceptCache(cache_file)
    identity = {"kind": "openai", "model": "m", "base_url": "http://llm.test/v1"}
    minimal = {"temperature": 0.0, "max_tokens": 8192}
    cache.put(percept_cache_key(identity, minimal, messages), identity, minimal, 0, messages, None,
              {"content": "Answer: 2", "usage": {"prompt_tokens": 1}, "model_version": "v0"})
    cache.close()

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": "should have come from the cache"})

    client = make_client("openai:m", base_url="http://llm.test/v1", sampling_params="minimal",
                         transport=httpx.MockTransport(refuse))
    run_eval(EvalSettings(bench, "openai:m", oracle="none", limit=1, seed=0, sampling_params="minimal"),
             tmp_path / "other" / "run", cache=cache_file, client=client, progress=False,
             retry=RetryPolicy(max_attempts=1))
    record = _records(tmp_path / "other" / "run")[0]
    assert record["case_id"] == plan.case_id
    assert record["questions"][0]["raw"] == "Answer: 2" and record["questions"][0]["cached"] is True
    assert record["questions"][0]["model_version"] == "v0"


def test_bad_sampling_params_value_is_refused():
    with pytest.raises(ConfigError, match="sampling-params"):
        make_client("openai:m", base_url="http://llm.test/v1", sampling_params="vllm")


class _FakeInputs(dict):
    def to(self, *args, **kwargs):
        return self


class _FakeProcessor:
    chat_template = "x"

    def apply_chat_template(self, *args, **kwargs):
        import torch

        return _FakeInputs(input_ids=torch.zeros((1, 3), dtype=torch.long))

    def decode(self, ids, skip_special_tokens=True):
        return "Answer: 1"


class _FakeModel:
    device = "cpu"
    dtype = None

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def generate(self, **kwargs):
        import torch

        self.calls.append({k: v for k, v in kwargs.items() if k != "input_ids"})
        return torch.zeros((1, 5), dtype=torch.long)


def _hf_client(tmp_path: Path, **opts):
    pytest.importorskip("torch")
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    client = make_client(f"hf:{folder}", **opts)
    model = _FakeModel()
    client._loaded = (_FakeProcessor(), model)
    return client, model


def test_hf_generation_is_given_explicit_settings(tmp_path):
    client, model = _hf_client(tmp_path, max_tokens=64)
    assert run_sync(client.complete([{"role": "user", "content": "x"}])).content == "Answer: 1"
    assert model.calls[-1] == {"max_new_tokens": 64, "do_sample": False, "num_beams": 1, "repetition_penalty": 1.0,
                               "no_repeat_ngram_size": 0}
    assert client.decoding["repetition_penalty"] == 1.0 and client.decoding["top_k"] == 0

    client, model = _hf_client(tmp_path, temperature=0.7, max_tokens=8, seed=0)
    run_sync(client.complete([{"role": "user", "content": "x"}], seed=3))
    assert model.calls[-1] == {"max_new_tokens": 8, "do_sample": True, "temperature": 0.7, "num_beams": 1,
                               "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "top_p": 1.0, "top_k": 0,
                               "min_p": 0.0, "typical_p": 1.0}

    client, model = _hf_client(tmp_path, max_tokens=64, sampling_params="minimal")
    run_sync(client.complete([{"role": "user", "content": "x"}]))
    assert model.calls[-1] == {"max_new_tokens": 64, "do_sample": False}  # the model's generation config applies
    assert client.decoding == {"temperature": 0.0, "max_tokens": 64}


def test_hf_explicit_settings_override_the_models_generation_config():
    """On a real (tiny) transformers model whose generation config samples with a repetition penalty and n-gram
    blocking, the explicit settings give plain greedy decoding; the minimal ones do not."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from cxrground.evaluation.percept.clients.hf import EXPLICIT_GENERATION, generate_kwargs

    config = transformers.LlamaConfig(vocab_size=24, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      bos_token_id=0, eos_token_id=1, pad_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
    gen = model.generation_config
    gen.repetition_penalty, gen.no_repeat_ngram_size, gen.do_sample, gen.top_k, gen.temperature = 3.0, 1, True, 1, 0.1
    gen.suppress_tokens = [1]  # no EOS: every reply is 10 tokens
    prompt = torch.tensor([[0, 5, 6, 7]])
    decoding = {"temperature": 0.0, "max_tokens": 10}
    with torch.inference_mode():
        ids = prompt
        for _ in range(10):  # greedy by hand
            logits = model(ids).logits[:, -1]
            logits[:, 1] = -1e9
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
        greedy = ids[0, 4:].tolist()
        explicit = model.generate(prompt, **generate_kwargs({**decoding, **EXPLICIT_GENERATION}))[0, 4:].tolist()
        minimal = model.generate(prompt, **generate_kwargs(decoding))[0, 4:].tolist()
    assert explicit == greedy
    assert minimal != greedy  # the model's own defaults (penalty, n-gram blocking) changed the reply


# -- 4. LF lesion order -------------------------------------------------------------------------------------------


def test_negative_cxrs_are_claimed_in_the_reference_curation_order():
    from cxrground.percept.cases import negative_candidates
    from cxrground.vocab.lesions import CURATION_ORDER, LESIONS

    assert CURATION_ORDER == ("cardiomegaly", "consolidation", "edema", "atelectasis", "pneumonia", "opacity",
                              "effusion")

    def study(dicom: str, *targets: str) -> dict:
        neg = [{"pair_id": f"{dicom}_negative_{i}", "target": t, "type": "global"} for i, t in enumerate(targets)]
        return {"dicom_id": dicom, "image_path": f"{dicom}.png",
                "instruction_answer_pairs": {"positive_pairs": [], "negative_pairs": neg}}

    dataset = {"train": {"s1": study("d1", "pneumonia", "consolidation", "effusion"),
                         "s2": study("d2", "pneumonia", "opacity"),
                         "s3": study("d3", "atelectasis", "edema"),
                         "s4": study("d4", "atelectasis", "opacity", "effusion")}}
    neg = negative_candidates(dataset, max_negatives=1)
    got = {lesion: [c.dicom_id for c in cands] for lesion, cands in neg.items()}
    # consolidation comes before pneumonia, edema before atelectasis (the order LESIONS gives is the other way)
    assert got == {"cardiomegaly": [], "pneumonia": ["d2"], "atelectasis": ["d4"], "opacity": [],
                   "consolidation": ["d1"], "edema": ["d3"], "effusion": []}
    assert tuple(neg) == LESIONS  # keyed in the paper's order, whatever the claim order


# -- 5. CPA side quirk flag ---------------------------------------------------------------------------------------


def test_cpa_either_side_reaches_the_build_settings_the_card_and_the_deformation(tmp_path, monkeypatch):
    from cxrground.io.masks import encode_rle
    from cxrground.percept import build as build_module
    from cxrground.percept import plans, revision
    from cxrground.percept.build import _settings_record
    from cxrground.percept.card import render_card
    from cxrground.percept.cases import Candidate
    from cxrground.percept.options import BuildOptions
    from cxrground.percept.request import BuildRequest

    # command line -> request -> settings
    seen: list[BuildOptions] = []

    def fake_build(opts, out, **kwargs):
        seen.append(opts)
        raise ConfigError("stop here")

    monkeypatch.setattr(build_module, "build_benchmark", fake_build)
    (tmp_path / "ils").mkdir()
    (tmp_path / "img").mkdir()
    args = ["percept", "build", "--ils", str(tmp_path / "ils"), "--images", str(tmp_path / "img"), "--out",
            str(tmp_path / "bench")]
    assert CliRunner().invoke(main, [*args, "--cpa-either-side"]).exit_code == 1
    assert CliRunner().invoke(main, args).exit_code == 1
    assert [o.cpa_either_side for o in seen] == [True, False]
    quirk, default = seen
    assert BuildRequest(ils_dir=tmp_path, images=tmp_path, out=tmp_path, cpa_either_side=True).options().cpa_either_side
    dataset = tmp_path / "ils" / "mimic_ils_instruction_answer.json"
    dataset.write_text("{}")
    record = _settings_record(quirk, dataset)
    assert record["settings"]["cpa_either_side"] is True and record["settings_hash"] != default.settings_hash()
    # builds made before the flag (and the deformer options, the per-lesion RF ratios) existed keep their settings hash
    legacy = {k: v for k, v in _settings_record(default, dataset)["settings"].items()
              if k not in ("cpa_either_side", "deformer_opt", "rf_ratios", "drop_estimated_hearts")}
    assert default.settings_hash() == sha256_json(legacy)[:16]
    card = render_card(quirk, {}, {}, None, [], None, "masks", {}, {})
    assert "either side's (the reference's behaviour, --cpa-either-side)" in card
    assert "CA, CO, ED, AT, PN, OP, EF" in card
    assert "its own side's only" in render_card(default, {}, {}, None, [], None, "masks", {}, {})

    # the plan of a candidate gets the deformation rule it asks for
    configs: list = []

    def fake_plan(*args, **kwargs):
        configs.append(args[6] if len(args) > 6 else kwargs.get("config"))
        raise revision.RevisionFailure("stop here")

    monkeypatch.setattr(revision, "plan_revision", fake_plan)
    monkeypatch.setattr(plans, "read_image", lambda path: SimpleNamespace(pixels=np.zeros((64, 64), np.uint8)))
    lung = np.zeros((64, 64), bool)
    lung[8:56, 4:28] = True
    anatomy = plans.AnatomySource(encode_rle(lung), encode_rle(lung[:, ::-1]), None, None, None, None)
    cand = Candidate(key_id="edema_p", lesion="edema", pair_id="p", study="s", split="train", dicom_id="d",
                     image_path="d.png", positive=True, pair_type="global")
    for either in (True, False):
        task = plans.PlanTask(cand, "c", "d.png", "dataset", encode_rle(lung), anatomy, 0, "builtin", {}, False,
                              cpa_either_side=either)
        assert plans.make_plan(task)["status"] == "failed"
    assert [c.cpa_same_side for c in configs] == [False, True]


def test_auto_sampling_params_are_minimal_for_hosted_apis_only():
    """The default ``auto``: vLLM's full set for any server, the minimal request for a hosted API that refuses it."""
    from cxrground.evaluation.percept.clients.decoding import resolve_sampling_params

    assert resolve_sampling_params("auto", "http://127.0.0.1:8000/v1") == "explicit"
    assert resolve_sampling_params("auto", "https://api.openai.com/v1") == "minimal"
    assert resolve_sampling_params("auto", "https://myres.openai.azure.com/openai/v1") == "minimal"
    assert resolve_sampling_params("auto", "https://generativelanguage.googleapis.com/v1beta/openai") == "minimal"
    assert resolve_sampling_params("auto", "https://notapi.openai.com.example.org/v1") == "explicit"
    assert resolve_sampling_params("auto", "https://api.openai.com./v1") == "minimal"
    assert resolve_sampling_params("auto", "https://res.cognitiveservices.azure.com/openai/v1") == "minimal"
    assert resolve_sampling_params("auto", "https://us-central1-aiplatform.googleapis.com/v1/projects/p") == "minimal"
    assert resolve_sampling_params("auto") == "explicit"
    assert resolve_sampling_params("explicit", "https://api.openai.com/v1") == "explicit"
    with pytest.raises(ConfigError, match="sampling-params"):
        resolve_sampling_params("greedy")
