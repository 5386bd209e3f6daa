"""End to end: a real tiny baseline checkpoint served by the ``cxrground serve`` command in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from click.testing import CliRunner  # noqa: E402

from cxrground.cli import main  # noqa: E402
from cxrground.io.image import read_image  # noqa: E402
from cxrground.io.masks import decode_rle  # noqa: E402
from cxrground.models.base import load_model  # noqa: E402
from serve_helpers import data_url, decode_png_b64  # noqa: E402

TINY = {"size": 32, "channels": [8, 16], "epochs": 1, "batch_size": 4, "anatomy": "none", "cond_hidden": 8,
        "head_hidden": 8}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(checkpoint, images root, one test-split pair with its image path) from a 4-study synthetic cohort."""
    from cxrground.models.baseline import train

    root = tmp_path_factory.mktemp("serve_baseline")
    runner = CliRunner()
    res = runner.invoke(main, ["synth", "--out", str(root / "cohort"), "--studies", "4", "--seed", "0"])
    assert res.exit_code == 0, res.output
    images = root / "cohort" / "files"
    res = runner.invoke(main, ["ils", "build", "--images", str(images), "--out", str(root / "ils"), "--seed", "0"])
    assert res.exit_code == 0, res.output
    ckpt = train(root / "ils", root / "ckpt", images=images, seed=0, overrides=TINY, val_split=None)
    data = json.loads((root / "ils" / "mimic_ils_instruction_answer.json").read_text())
    study, pair = next((s, p) for split in ("test", "train") for s in data[split].values()
                       for p in s["instruction_answer_pairs"]["positive_pairs"])
    return ckpt, images / study["image_path"], pair


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(checkpoint):
    ckpt = checkpoint[0]
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cxrground", "serve", "--checkpoint", str(ckpt), "--port",
                             str(port), "--max-upload-mb", "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"cxrground serve exited with {proc.returncode}: {proc.stdout.read().decode()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).json()["status"] == "ok":
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("cxrground serve did not come up within 90 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_served_baseline_matches_the_model(checkpoint, server):
    ckpt, image_path, pair = checkpoint
    image = read_image(image_path)
    want = load_model(ckpt).predict(image, pair["instruction"])

    resp = httpx.post(f"{server}/v1/segment", timeout=60,
                      files={"image": (image_path.name, image_path.read_bytes(), "image/jpeg")},
                      data={"instruction": pair["instruction"]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["image_size"] == list(image.shape)
    assert body["model"]["name"] == "baseline" and body["model"]["checkpoint"].startswith("ckpt@")
    assert body["answer"] == want.answer and body["answer"].startswith("[SEG]")
    assert body["structured"] == want.structured()
    assert body["structured"]["instruction_type"] == pair["type"]
    rle = decode_rle(body["mask"], image.shape)
    np.testing.assert_array_equal(rle, want.mask)
    np.testing.assert_array_equal(decode_png_b64(body["mask_png"]) > 0, rle)

    client = openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["baseline"]
    completion = client.chat.completions.create(model="baseline", messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(image_path.read_bytes(), "image/jpeg")}},
        {"type": "text", "text": pair["instruction"]},
    ]}])
    assert completion.choices[0].message.content == want.answer
    np.testing.assert_array_equal(decode_rle(completion.model_extra["cxrground"]["mask"], image.shape), want.mask)


def test_served_limits_come_from_the_command_line(server):
    limits = httpx.get(f"{server}/health", timeout=10).json()["limits"]
    assert limits["max_upload_bytes"] == 4 * 1024 * 1024
    assert limits["max_pixels"] == 40_000_000


def test_multi_worker_app_factory_loads_from_the_environment(checkpoint, monkeypatch):
    """``--workers N`` hands the checkpoint and limits to each worker through the environment."""
    from dataclasses import asdict

    from cxrground.serve.limits import Limits
    from cxrground.serve.run import app_from_env

    limits = Limits(max_upload_bytes=1234, max_pixels=99, allowed_types=("png", "dicom"))
    monkeypatch.setenv("CXRGROUND_SERVE_CHECKPOINT", str(checkpoint[0]))
    monkeypatch.setenv("CXRGROUND_SERVE_LIMITS", json.dumps(asdict(limits)))
    app = app_from_env()
    assert app.state.cxr.model.name == "baseline"
    assert app.state.cxr.limits == limits


def test_benchmark_harness_calls_the_served_model(server, tmp_path):
    """``percept eval --model openai:...`` speaks to ``cxrground serve``. The baseline understands only ILS
    instructions, so the server refuses the benchmark's questions with a 400 that says why; the harness
    records every case as failed with that message and scores it wrong: nothing is lost or dropped."""
    from cxrground.testing.mock_bench import make_benchmark

    bench = make_benchmark(tmp_path / "bench", {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",), size=16)
    run = tmp_path / "runs" / "served"
    res = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "openai:baseline",
                                    "--base-url", f"{server}/v1", "--out", str(run), "--oracle", "none",
                                    "--no-progress", "--max-attempts", "1"])
    assert res.exit_code == 1 and "every case failed" in res.output, res.output  # said, and recorded
    results = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert sorted(r["path"] for r in results) == ["LF", "RF", "RR"]
    for r in results:
        assert r["status"] == "failed"
        assert "HTTP 400" in r["error"] and "does not follow an ILS template" in r["error"]
    res = CliRunner().invoke(main, ["percept", "score", str(run), "--bootstrap", "0"])
    assert res.exit_code == 0, res.output
    score = json.loads((run / "score.json").read_text())
    for path in ("LF", "RF", "RR"):  # failed cases stay in the denominators
        assert score["paths"][path]["oracle_passed"]["stage1"]["acc"] == 0.0
