"""Serve hardening: decompression bombs refused from the header, the optional API key, CORS off by default."""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from click.testing import CliRunner  # noqa: E402

from cxrground.cli import main  # noqa: E402
from cxrground.errors import ConfigError  # noqa: E402
from cxrground.io.dicom import write_dicom  # noqa: E402
from cxrground.serve.access import AccessPolicy, read_api_key  # noqa: E402
from cxrground.serve.app import create_app  # noqa: E402
from cxrground.serve.decode import image_header_size  # noqa: E402
from cxrground.serve.limits import Limits  # noqa: E402
from cxrground.serve.run import BackgroundServer  # noqa: E402
from serve_helpers import ThresholdModel, cxr_pixels, data_url, png_bytes  # noqa: E402

KEY = "s3cret-key"
INSTRUCTION = "Segment the effusion."
ORIGIN = "http://viewer.example"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header states ``width`` × ``height`` (its data is far too short)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + _chunk(b"IEND", b""))


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small baseline JPEG header (SOF0 + SOS) stating ``width`` × ``height``."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    sos = b"\xff\xda" + struct.pack(">HB", 8, 1) + b"\x01\x00\x00\x3f\x00"
    return b"\xff\xd8" + sof + sos + b"\0" * 16 + b"\xff\xd9"


def dicom_claiming(tmp_path, rows: int, cols: int) -> bytes:
    """A DICOM file whose Rows/Columns state ``rows`` × ``cols`` over a tiny pixel buffer."""
    import pydicom

    path = tmp_path / "small.dcm"
    write_dicom(path, np.zeros((8, 8), np.uint16))
    ds = pydicom.dcmread(path)
    ds.Rows, ds.Columns = rows, cols
    out = io.BytesIO()
    ds.save_as(out, enforce_file_format=True)
    return out.getvalue()


def _upload(client, data: bytes, headers: dict | None = None):
    return client.post("/v1/segment", files={"image": ("x.png", data, "application/octet-stream")},
                       data={"instruction": INSTRUCTION}, headers=headers or {})


# --- decompression bombs -------------------------------------------------------------------------

def test_header_size_is_read_without_pil_bomb_check(tmp_path):
    assert image_header_size(png_claiming(20_000, 30_000), "png") == (30_000, 20_000)
    assert image_header_size(jpeg_claiming(60_000, 50_000), "jpeg") == (50_000, 60_000)
    assert image_header_size(dicom_claiming(tmp_path, 40_000, 30_000), "dicom") == (40_000, 30_000)


@pytest.mark.parametrize("max_pixels", [100_000, 10**10])  # below and above PIL's own bomb limit
def test_decompression_bomb_is_413_from_the_header(tmp_path, max_pixels):
    limits = Limits(max_upload_bytes=200_000, max_pixels=max_pixels)
    bombs = {"png": png_claiming(20_000, 20_000), "jpeg": jpeg_claiming(60_000, 60_000),
             "dicom": dicom_claiming(tmp_path, 30_000, 30_000)}
    with (BackgroundServer(create_app(ThresholdModel(), limits)) as server,
          httpx.Client(base_url=server.url, timeout=30) as client):
        for kind, data in bombs.items():
            resp = _upload(client, data)
            assert resp.status_code == 413, (kind, resp.text)
            err = resp.json()["error"]
            assert err["type"] == "too_many_pixels" and "pixels" in err["message"], (kind, err)
            chat = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(data)}}, {"type": "text", "text": INSTRUCTION}]}]})
            assert chat.status_code == 413 and chat.json()["error"]["type"] == "too_many_pixels", (kind, chat.text)
        # the connection is still usable and a normal image still works
        ok = _upload(client, png_bytes(cxr_pixels()))
        assert ok.status_code == 200, ok.text


# --- API key -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed():
    app = create_app(ThresholdModel(), Limits(max_upload_bytes=200_000), access=AccessPolicy(api_key=KEY))
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield server, client


ROUTES = [("GET", "/"), ("GET", "/static/app.js"), ("GET", "/v1/models"), ("GET", "/v1/examples"),
          ("POST", "/v1/segment"), ("POST", "/v1/chat/completions"), ("GET", "/no/such/route")]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_but_health_needs_the_key(keyed, method, path):
    _, client = keyed
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic x"},
                    {"api-key": "wrong"}):
        resp = client.request(method, path, headers=headers)
        assert resp.status_code == 401, (path, headers, resp.text)
        assert resp.json()["error"]["type"] == "invalid_api_key"
        assert resp.headers["www-authenticate"] == "Bearer"
        assert KEY not in resp.text
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"api-key": KEY}):
        resp = client.request(method, path, headers=headers)
        assert resp.status_code != 401, (path, headers, resp.text)
        assert resp.status_code == (404 if path.startswith("/no/") else 415 if method == "POST" else 200)


def test_health_needs_no_key_and_unauthorised_bodies_are_not_read(keyed):
    _, client = keyed
    assert client.get("/health").json()["status"] == "ok"
    huge = b"x" * (Limits(max_upload_bytes=200_000).max_body_bytes + 1)
    resp = client.post("/v1/segment", content=huge, headers={"content-type": "application/json"})
    assert resp.status_code == 401  # refused before the body limit is even looked at
    good = _upload(client, png_bytes(cxr_pixels()), {"Authorization": f"Bearer {KEY}"})
    assert good.status_code == 200 and good.json()["mask_pixels"] > 0


def test_openai_client_sends_the_key(keyed):
    server, _ = keyed
    msg = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png_bytes(cxr_pixels()))}},
                                       {"type": "text", "text": "Segment the effusion."}]}
    good = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=30)
    assert good.chat.completions.create(model="m", messages=[msg]).choices[0].message.content
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=[msg])


def test_read_api_key(monkeypatch):
    monkeypatch.setenv("MY_KEY", " abc ")
    assert read_api_key("MY_KEY") == "abc"
    monkeypatch.setenv("MY_KEY", "  ")
    with pytest.raises(ConfigError, match="MY_KEY"):
        read_api_key("MY_KEY")
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(ConfigError, match="MY_KEY"):
        read_api_key("MY_KEY")
    with pytest.raises(ValueError):
        AccessPolicy(api_key="")


# --- CORS ----------------------------------------------------------------------------------------

def _preflight(client, origin: str = ORIGIN):
    return client.options("/v1/segment", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                  "Access-Control-Request-Headers": "authorization"})


def test_cors_is_off_by_default():
    with (BackgroundServer(create_app(ThresholdModel())) as server,
          httpx.Client(base_url=server.url, timeout=30) as client):
        assert "access-control-allow-origin" not in _preflight(client).headers
        assert "access-control-allow-origin" not in client.get("/health", headers={"Origin": ORIGIN}).headers


def test_cors_allows_only_the_given_origins_and_preflight_needs_no_key():
    app = create_app(ThresholdModel(), access=AccessPolicy(api_key=KEY, cors_origins=(ORIGIN,)))
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        pre = _preflight(client)
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-origin" not in _preflight(client, "http://evil.example").headers
        denied = client.get("/v1/models", headers={"Origin": ORIGIN})
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
        ok = client.get("/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
        # the official OpenAI JavaScript client's own headers pass the preflight
        stainless = "authorization,content-type,x-stainless-lang,x-stainless-os,x-stainless-runtime," \
                    "x-stainless-retry-count,x-stainless-package-version"
        pre = client.options("/v1/chat/completions", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                              "Access-Control-Request-Headers": stainless})
        assert pre.status_code == 200 and "x-stainless-lang" in pre.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in pre.headers  # no cookie ever travels cross-origin


# --- command line --------------------------------------------------------------------------------

def test_cli_api_key_env_and_cors_origin(monkeypatch, tmp_path):
    import cxrground.serve.run as run

    calls = []
    monkeypatch.setattr(run, "serve", lambda checkpoint, **kw: calls.append((checkpoint, kw)))
    (tmp_path / "checkpoint.json").write_text('{"model": "baseline"}')
    runner = CliRunner()
    res = runner.invoke(main, ["serve", "--checkpoint", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert calls[-1][1]["access"] == AccessPolicy()
    monkeypatch.delenv("CXR_KEY", raising=False)
    res = runner.invoke(main, ["serve", "--checkpoint", str(tmp_path), "--api-key-env", "CXR_KEY"])
    assert res.exit_code != 0 and "CXR_KEY" in res.output and len(calls) == 1
    monkeypatch.setenv("CXR_KEY", KEY)
    res = runner.invoke(main, ["serve", "--checkpoint", str(tmp_path), "--api-key-env", "CXR_KEY",
                               "--cors-origin", ORIGIN, "--cors-origin", "http://b.example", "--host", "0.0.0.0"])
    assert res.exit_code == 0, res.output
    access = calls[-1][1]["access"]
    assert access.api_key == KEY and access.api_key_env == "CXR_KEY"
    assert access.cors_origins == (ORIGIN, "http://b.example")
    assert "no authentication" not in res.output and KEY not in res.output


def test_workers_get_the_access_policy_through_the_environment(monkeypatch, tmp_path):
    import uvicorn

    import cxrground.serve.run as run

    for name in ("CXRGROUND_SERVE_CHECKPOINT", "CXRGROUND_SERVE_DEVICE", "CXRGROUND_SERVE_LIMITS",
                 "CXRGROUND_SERVE_ACCESS", "CXRGROUND_SERVE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    created = []
    monkeypatch.setattr(run, "load_and_create", lambda checkpoint, **kw: created.append(kw) or (None, None))
    monkeypatch.setenv("CXR_KEY", KEY)
    policy = AccessPolicy(api_key=KEY, api_key_env="CXR_KEY", cors_origins=(ORIGIN,))
    run.serve(tmp_path, workers=2, access=policy)
    assert KEY not in "".join(v for k, v in os.environ.items() if k.startswith("CXRGROUND_SERVE_"))
    run.app_from_env()
    assert created[-1]["access"] == policy
    run.serve(tmp_path, workers=2, access=AccessPolicy(api_key="other-key"))  # a key without a variable name
    run.app_from_env()
    assert created[-1]["access"].api_key == "other-key"


def test_reading_a_bomb_file_is_an_image_read_error(tmp_path):
    from cxrground.errors import ImageReadError
    from cxrground.io.image import read_image

    path = tmp_path / "bomb.png"
    path.write_bytes(png_claiming(20_000, 20_000))
    with pytest.raises(ImageReadError, match=r"bomb\.png.*too many pixels"):
        read_image(path)
