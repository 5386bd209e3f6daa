"""The HTTP API of ``cxrground serve``: /v1/segment (multipart and JSON), limits and every 4xx, CLI wiring."""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from click.testing import CliRunner  # noqa: E402

from cxrground.cli import main  # noqa: E402
from cxrground.io.dicom import write_dicom  # noqa: E402
from cxrground.io.masks import decode_rle  # noqa: E402
from cxrground.serve.app import OVERLAY_COLOUR, create_app, example_instructions  # noqa: E402
from cxrground.serve.limits import Limits  # noqa: E402
from cxrground.serve.run import BackgroundServer, is_loopback  # noqa: E402
from cxrground.vocab import ils_templates  # noqa: E402
from serve_helpers import (  # noqa: E402
    ThresholdModel,
    cxr_pixels,
    data_url,
    decode_png_b64,
    expected_output,
    png_bytes,
)

LIMITS = Limits(max_upload_bytes=200_000, max_pixels=100_000, max_instruction_chars=200)
INSTRUCTION = "Segment the effusion."


@pytest.fixture(scope="module")
def model():
    return ThresholdModel(delay=0.02)


@pytest.fixture(scope="module")
def client(model):
    with (BackgroundServer(create_app(model, LIMITS, checkpoint="test@0")) as server,
          httpx.Client(base_url=server.url, timeout=30) as c):
        yield c


def _upload(client, data: bytes, instruction: str = INSTRUCTION, name: str = "cxr.png", **fields):
    return client.post("/v1/segment", files={"image": (name, data, "application/octet-stream")},
                       data={"instruction": instruction, **fields})


def _error(resp, status: int, kind: str, *words: str) -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["type"] == kind, err
    for w in words:
        assert w in err["message"], err["message"]
    return err["message"]


def test_multipart_segment_native_size_rle_equals_png(client):
    px = cxr_pixels(50, 70)
    resp = _upload(client, png_bytes(px))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    want = expected_output(px, INSTRUCTION)
    assert body["answer"] == want.answer == "[SEG] It is located in the right lung."
    assert body["structured"] == want.structured()
    assert body["image_size"] == [50, 70]
    rle_mask = decode_rle(body["mask"], (50, 70))
    png_mask = decode_png_b64(body["mask_png"])
    assert png_mask.shape == (50, 70) and set(np.unique(png_mask)) == {0, 255}
    np.testing.assert_array_equal(rle_mask, png_mask > 0)
    np.testing.assert_array_equal(rle_mask, want.mask)
    assert body["mask_pixels"] == int(want.mask.sum()) == 400
    assert body["model"] == {"name": "threshold-test", "checkpoint": "test@0"}
    assert set(body["timing_ms"]) == {"decode", "model", "encode", "total"}
    assert "overlay_png" not in body and "image_png" not in body


def test_json_base64_and_data_url_with_mask_formats(client):
    px = cxr_pixels(50, 70)
    raw = base64.b64encode(png_bytes(px)).decode()
    instruction = ils_templates.instruction("basic", "edema", ["right lung"])
    rle_only = client.post("/v1/segment", json={"image": raw, "instruction": instruction, "mask_format": "rle"})
    assert rle_only.status_code == 200, rle_only.text
    assert "mask" in rle_only.json() and "mask_png" not in rle_only.json()
    png_only = client.post("/v1/segment?mask_format=png",
                           json={"image": data_url(png_bytes(px)), "instruction": instruction})
    assert png_only.status_code == 200 and "mask" not in png_only.json()
    np.testing.assert_array_equal(decode_rle(rle_only.json()["mask"]), decode_png_b64(png_only.json()["mask_png"]) > 0)
    assert rle_only.json()["answer"] == ils_templates.positive_answer("basic", "edema") == "[SEG]"


def test_overlay_and_image_png(client):
    px = cxr_pixels(50, 70)
    body = _upload(client, png_bytes(px), overlay="true", include_image="true").json()
    overlay = decode_png_b64(body["overlay_png"])
    assert overlay.shape == (50, 70, 3)
    mask = px >= 200
    inside = overlay[mask].astype(int)
    outside = overlay[~mask & ~np.roll(mask, 1, 0) & ~np.roll(mask, 1, 1)].astype(int)
    colour = np.asarray(OVERLAY_COLOUR)
    assert (np.abs(inside[:, 1] - inside[:, 0]) > 50).all() == bool(colour[1] != colour[0])
    assert (outside[:, 0] == outside[:, 1]).all() and (outside[:, 1] == outside[:, 2]).all()
    np.testing.assert_array_equal(decode_png_b64(body["image_png"]), px)


def test_negative_answer_and_empty_mask(client):
    px = np.full((40, 30), 90, dtype=np.uint8)
    instruction = ils_templates.instruction("basic", "atelectasis", ["left lung base"])
    body = _upload(client, png_bytes(px), instruction).json()
    assert body["answer"] == ils_templates.negative_answer("basic", "atelectasis", ["left lung base"])
    assert body["structured"]["present"] is False and body["mask_pixels"] == 0
    assert not decode_rle(body["mask"], (40, 30)).any()


def test_sixteen_bit_png_and_dicom_uploads(client, tmp_path):
    px16 = (cxr_pixels(50, 70).astype(np.uint16) * 257)
    body = _upload(client, png_bytes(px16)).json()
    assert body["image_size"] == [50, 70] and body["mask_pixels"] == 400
    dcm = write_dicom(tmp_path / "x.dcm", cxr_pixels(50, 70))
    body = _upload(client, dcm.read_bytes(), name="whatever.png").json()
    assert body["image_size"] == [50, 70]
    assert body["answer"] == "[SEG] It is located in the right lung."


def test_jpeg_upload(client):
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(cxr_pixels(50, 70)).save(buf, format="JPEG", quality=98)
    body = _upload(client, buf.getvalue()).json()
    assert body["image_size"] == [50, 70] and body["mask_pixels"] > 300


def test_oversize_bytes_pixels_and_body(client):
    rng = np.random.default_rng(0)
    noisy = png_bytes(rng.integers(0, 256, (300, 300, 3), dtype=np.uint8))  # RGB: 270 kB, 90k px
    assert len(noisy) > LIMITS.max_upload_bytes
    _error(_upload(client, noisy), 413, "payload_too_large", str(len(noisy)), "200000 bytes")
    big = png_bytes(np.zeros((400, 300), np.uint8))
    assert len(big) < LIMITS.max_upload_bytes
    _error(_upload(client, big), 413, "too_many_pixels", "300x400", "100000 pixels")
    huge = b"x" * (LIMITS.max_body_bytes + 1)
    _error(client.post("/v1/segment", content=huge, headers={"content-type": "application/json"}), 413,
           "payload_too_large", "request body")

    def chunks():  # no Content-Length: the body is counted as it streams
        for _ in range(LIMITS.max_body_bytes // 65536 + 2):
            yield b"y" * 65536

    _error(client.post("/v1/segment", content=chunks(), headers={"content-type": "application/json"}), 413,
           "payload_too_large", "exceeds")


def test_wrong_type_and_corrupt_images(client):
    _error(_upload(client, b"GIF89a" + bytes(100), name="x.gif"), 415, "unsupported_media_type",
           "unrecognised format", "PNG, JPEG, DICOM")
    _error(_upload(client, b"just some text, not an image"), 415, "unsupported_media_type")
    good = png_bytes(cxr_pixels())
    _error(_upload(client, good[:8] + b"\0" * 64), 400, "invalid_image", "cannot decode the PNG image")
    _error(_upload(client, good[: len(good) // 2]), 400, "invalid_image", "truncated or corrupt")
    _error(_upload(client, b""), 400, "invalid_image", "empty")
    _error(client.post("/v1/segment", content=b"a=b", headers={"content-type": "text/plain"}), 415,
           "unsupported_media_type", "application/json")
    png_only = Limits(max_upload_bytes=200_000, allowed_types=("png",))
    with BackgroundServer(create_app(ThresholdModel(), png_only)) as server:
        resp = httpx.post(f"{server.url}/v1/segment", files={"image": ("x.jpg", b"\xff\xd8\xff" + bytes(64))},
                          data={"instruction": INSTRUCTION}, timeout=30)
    _error(resp, 415, "unsupported_media_type", "JPEG", "accepts PNG")


def test_instruction_errors(client):
    good = png_bytes(cxr_pixels())
    _error(_upload(client, good, "   "), 400, "invalid_request", "instruction is empty")
    _error(_upload(client, good, "x" * 201), 400, "invalid_request", "201 characters", "limit is 200")
    _error(client.post("/v1/segment", json={"image": data_url(good)}), 422, "validation_error", "instruction")
    _error(client.post("/v1/segment", json={"image": data_url(good), "instruction": INSTRUCTION,
                                            "mask_format": "svg"}), 422, "validation_error", "mask_format")
    _error(client.post("/v1/segment", json=["not", "an", "object"]), 422, "validation_error")
    _error(client.post("/v1/segment", content=b"{bad json", headers={"content-type": "application/json"}), 400,
           "invalid_request", "not valid JSON")
    _error(client.post("/v1/segment", data={"instruction": INSTRUCTION, "image": "abc"}, files={"x": ("a", b"b")}),
           400, "invalid_request", "'image' must be an uploaded file")


@pytest.mark.parametrize("image", ["https://example.org/cxr.png", "http://10.0.0.1/a.dcm"])
def test_remote_urls_are_not_fetched(client, image):
    _error(client.post("/v1/segment", json={"image": image, "instruction": INSTRUCTION}), 400, "invalid_image",
           "remote URLs are not fetched")


@pytest.mark.parametrize("image", ["/etc/passwd", "../../x.png", "C:\\images\\cxr.dcm", "file:///tmp/x.png",
                                   "~/cxr.jpg", "images/cxr.png"])
def test_file_system_paths_are_refused(client, image):
    _error(client.post("/v1/segment", json={"image": image, "instruction": INSTRUCTION}), 400, "invalid_image",
           "file-system paths are not accepted")


def test_base64_that_starts_like_a_path_is_still_an_image(client):
    """JPEG base64 starts with '/9j/': it must be decoded, not taken for a path."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(cxr_pixels(50, 70)).save(buf, format="JPEG", quality=98)
    b64 = base64.b64encode(buf.getvalue()).decode()
    assert b64.startswith("/9j/")
    resp = client.post("/v1/segment", json={"image": b64, "instruction": INSTRUCTION})
    assert resp.status_code == 200, resp.text
    _error(client.post("/v1/segment", json={"image": "not base64!", "instruction": INSTRUCTION}), 400,
           "invalid_image", "not valid base64")
    _error(client.post("/v1/segment", json={"image": "data:image/png,abc", "instruction": INSTRUCTION}), 400,
           "invalid_image", "data:<type>;base64")


def test_info_routes(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model"] == "threshold-test"
    assert health["limits"]["max_pixels"] == 100_000
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["threshold-test"]
    examples = client.get("/v1/examples").json()["instructions"]
    assert examples == example_instructions()
    assert ils_templates.instruction("global", "cardiomegaly") in examples
    assert ils_templates.instruction("lesion_inference", "opacity", ["right lung"]) in examples
    _error(client.get("/nowhere"), 404, "not_found")
    _error(client.get("/v1/segment"), 405, "method_not_allowed")
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_no_model_loaded_is_503():
    with BackgroundServer(create_app(None)) as server:
        resp = httpx.post(f"{server.url}/v1/segment", files={"image": ("x.png", png_bytes(cxr_pixels()))},
                          data={"instruction": INSTRUCTION}, timeout=30)
        _error(resp, 503, "model_not_loaded")
        assert httpx.get(f"{server.url}/health").json()["status"] == "loading"
        assert httpx.get(f"{server.url}/v1/models").json()["data"] == []


def test_model_calls_are_serialised(client, model):
    """Concurrent requests never run the (not thread-safe) model at the same time."""
    before = model.calls
    results: list[int] = []

    def call():
        results.append(_upload(client, png_bytes(cxr_pixels())).status_code)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [200] * 6
    assert model.calls - before == 6
    assert model.max_active == 1


def test_limits_validation():
    with pytest.raises(ValueError):
        Limits(max_upload_bytes=0)
    with pytest.raises(ValueError):
        Limits(allowed_types=("gif",))
    assert Limits(max_upload_bytes=3).max_body_bytes == 4 + 256 * 1024


def test_cli_serve_options_and_loopback_warning(monkeypatch, tmp_path):
    import cxrground.serve.run as run

    calls = []
    monkeypatch.setattr(run, "serve", lambda checkpoint, **kw: calls.append((checkpoint, kw)))
    (tmp_path / "checkpoint.json").write_text('{"model": "baseline"}')
    runner = CliRunner()
    res = runner.invoke(main, ["serve", "--checkpoint", str(tmp_path), "--port", "0", "--max-upload-mb", "1.5",
                               "--max-pixels", "1000"])
    assert res.exit_code == 0, res.output
    assert "warning" not in res.output
    checkpoint, kw = calls[-1]
    assert checkpoint == tmp_path and kw["host"] == "127.0.0.1" and kw["port"] == 0 and kw["workers"] == 1
    assert kw["limits"].max_upload_bytes == int(1.5 * 1024 * 1024) and kw["limits"].max_pixels == 1000
    res = runner.invoke(main, ["serve", "--checkpoint", str(tmp_path), "--host", "0.0.0.0"])
    assert res.exit_code == 0 and "warning: binding to 0.0.0.0" in res.output
    assert is_loopback("localhost") and is_loopback("::1") and not is_loopback("192.168.1.4")


def test_read_image_bytes_formats_and_errors(tmp_path):
    from cxrground.errors import ImageReadError
    from cxrground.io.image import read_image, read_image_bytes

    px = cxr_pixels(50, 70)
    img = read_image_bytes(png_bytes(px))
    np.testing.assert_array_equal(img.pixels, px)
    assert img.path is None and img.source_format == "png" and img.bits_stored == 8
    png16 = png_bytes(px.astype(np.uint16) * 257)
    img16 = read_image_bytes(png16, name="upload.png")
    assert img16.bits_stored == 16 and img16.path == "upload.png"
    np.testing.assert_array_equal(img16.pixels, read_image(_write(tmp_path / "a.png", png16)).pixels)
    dcm = write_dicom(tmp_path / "x.dcm", px)
    from_bytes = read_image_bytes(dcm.read_bytes())
    assert from_bytes.source_format == "dicom" and from_bytes.path is None
    np.testing.assert_array_equal(from_bytes.pixels, read_image(dcm).pixels)
    with pytest.raises(ImageReadError, match="empty"):
        read_image_bytes(b"")
    with pytest.raises(ImageReadError, match=r"^scan\.png: not a recognised image format"):
        read_image_bytes(b"hello", name="scan.png")
    with pytest.raises(ImageReadError, match=r"^scan\.dcm: .*DICOM"):
        read_image_bytes(b"hello" * 40, name="scan.dcm")


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


class _BrokenModel:
    """Refuses one instruction as bad input and returns a wrongly sized mask for the rest."""

    name = "broken"

    def predict(self, image, instruction):
        from cxrground.errors import InputError
        from cxrground.models.base import IlsOutput

        if "refuse" in instruction:
            raise InputError("instruction names no known lesion")
        return IlsOutput(answer="[SEG]", mask=np.zeros((2, 2), bool), presence=1.0, present=True)

    def predict_batch(self, images, instructions):
        return [self.predict(i, t) for i, t in zip(images, instructions, strict=True)]


def test_model_failures_are_reported():
    with BackgroundServer(create_app(_BrokenModel())) as server:
        def post(text):
            return httpx.post(f"{server.url}/v1/segment", files={"image": ("x.png", png_bytes(cxr_pixels()))},
                              data={"instruction": text}, timeout=30)

        _error(post("please refuse"), 400, "invalid_request", "cannot use this input", "no known lesion")
        _error(post(INSTRUCTION), 500, "model_error", "(2, 2)", "(50, 70)")
