"""``cxrground serve`` under idle and hostile clients: image work off the event loop and bounded in number, idle
connections closed (and evicted when too many), bodies that never arrive, clients that never read their responses
(dropped after the send timeout, slow but steady readers served in full), bad JSON, clients that vanish mid-body,
no CDN-loading docs pages, and the process-level guards (open-file limit, accept-error log)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

pytest.importorskip("fastapi")

import httpx

from cxrground.io.image import CXRImage
from cxrground.io.overlay import overlay_masks
from cxrground.models.base import IlsOutput
from cxrground.net.connections import (
    AcceptErrorFilter,
    BodyDeadline,
    BodyTimeout,
    LogThrottle,
    guarded_protocol,
    prepare_process,
)
from cxrground.serve import app as app_module
from cxrground.serve.app import OVERLAY_ALPHA, OVERLAY_COLOUR, create_app
from cxrground.serve.decode import decode_image_bytes
from cxrground.serve.limits import Limits
from cxrground.serve.run import BackgroundServer
from cxrground.testing.servers import (
    LogRecords,
    captured_logs,
    closed_by_server,
    read_until_closed,
    response_length,
    small_window_socket,
    wait_for_bytes,
    wait_for_log,
)
from serve_helpers import ThresholdModel, cxr_pixels, data_url, png_bytes

INSTRUCTION = "Segment the effusion."
DROPPED = "dropped the connection of"


@dataclass
class _StallModel(ThresholdModel):
    """Waits (at most 10 s) inside predict until released: a request stuck in a slow model."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def predict(self, image: CXRImage, instruction: str) -> IlsOutput:
        self.entered.set()
        self.release.wait(10)
        return super().predict(image, instruction)







def _port(server: BackgroundServer) -> int:
    assert server.port is not None
    return server.port


def _big_segment_request() -> bytes:
    """A raw multipart ``/v1/segment`` request whose answer is about 10 MB of JSON (a noise image: its overlay,
    mask and image PNGs barely compress), far more than the kernel's socket buffers hold."""
    pixels = np.random.default_rng(0).integers(0, 256, (1536, 1536), dtype=np.uint8)
    request = httpx.Request("POST", "http://x/v1/segment?overlay=true&include_image=true",
                            files={"image": ("x.png", png_bytes(pixels))}, data={"instruction": INSTRUCTION})
    body = request.read()
    head = (f"POST /v1/segment?overlay=true&include_image=true HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: {request.headers['content-type']}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body





def _upload(url: str, timeout: float = 20.0) -> httpx.Response:
    return httpx.post(f"{url}/v1/segment", files={"image": ("x.png", png_bytes(cxr_pixels()))},
                      data={"instruction": INSTRUCTION}, timeout=timeout)


def test_health_answers_at_once_while_image_requests_run_and_extra_ones_get_busy() -> None:
    model = _StallModel()
    app = create_app(model, Limits(max_in_flight=1, busy_wait_s=0.3))
    with BackgroundServer(app, limit_concurrency=None) as server:
        first: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: first.append(_upload(server.url)))
        worker.start()
        try:
            assert model.entered.wait(5), "the first request never reached the model"
            t0 = time.monotonic()
            health = httpx.get(f"{server.url}/health", timeout=5)
            assert health.status_code == 200 and time.monotonic() - t0 < 1.0
            t0 = time.monotonic()
            busy = _upload(server.url, timeout=5)
            waited = time.monotonic() - t0
            assert busy.status_code == 503, busy.text
            assert busy.json()["error"]["type"] == "busy" and busy.headers["retry-after"] == "1"
            assert 0.25 <= waited < 3.0
        finally:
            model.release.set()
            worker.join(20)
        assert [r.status_code for r in first] == [200]
        assert _upload(server.url).status_code == 200  # the slot is free again


def test_decoding_the_model_and_encoding_run_off_the_event_loop(monkeypatch) -> None:
    seen: dict[str, set[str]] = {"decode": set(), "encode": set()}
    real_bytes, real_string, real_png = (app_module.decode_image_bytes, app_module.decode_image_string,
                                         app_module._png_base64)

    def spy(kind, real):
        def wrapped(*a, **k):
            seen[kind].add(threading.current_thread().name)
            return real(*a, **k)
        return wrapped

    monkeypatch.setattr(app_module, "decode_image_bytes", spy("decode", real_bytes))
    monkeypatch.setattr(app_module, "decode_image_string", spy("decode", real_string))
    monkeypatch.setattr(app_module, "_png_base64", spy("encode", real_png))
    image = png_bytes(cxr_pixels())
    with BackgroundServer(create_app(ThresholdModel())) as server, \
            httpx.Client(base_url=server.url, timeout=20) as client:
        assert client.post("/v1/segment", files={"image": ("x.png", image)},
                           data={"instruction": INSTRUCTION, "overlay": "true"}).status_code == 200
        assert client.post("/v1/segment", json={"image": data_url(image), "instruction": INSTRUCTION,
                                                "include_image": True}).status_code == 200
        parts = [{"type": "text", "text": INSTRUCTION}, {"type": "image_url", "image_url": {"url": data_url(image)}}]
        chat = {"messages": [{"role": "user", "content": parts}]}
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
    assert seen["decode"] and seen["encode"]
    for kind, names in seen.items():
        assert "cxrground-serve" not in names, (kind, names)  # the event loop's thread


def test_banded_overlay_equals_the_whole_image_overlay() -> None:
    rng = np.random.default_rng(3)
    for shape in [(1, 5), (7, 9), (300, 41), (513, 64)]:
        pixels = (rng.random(shape) * 255).astype(np.uint8)
        mask = rng.random(shape) > 0.5
        mask[: shape[0] // 2, : shape[1] // 2] = True
        want = overlay_masks(pixels, [mask], [OVERLAY_COLOUR], OVERLAY_ALPHA, band_rows=10**9)
        np.testing.assert_array_equal(overlay_masks(pixels, [mask], [OVERLAY_COLOUR], OVERLAY_ALPHA, band_rows=64),
                                      want)


def test_idle_and_half_sent_connections_are_closed_after_the_idle_timeout() -> None:
    with BackgroundServer(create_app(ThresholdModel()), limit_concurrency=None, idle_timeout=1.0) as server:
        port = _port(server)
        idle = socket.create_connection(("127.0.0.1", port), timeout=5)
        half = socket.create_connection(("127.0.0.1", port), timeout=5)
        half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        try:
            t0 = time.monotonic()
            assert closed_by_server(idle) and closed_by_server(half)
            assert 0.8 <= time.monotonic() - t0 < 4.0
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        finally:
            idle.close()
            half.close()


def test_too_many_idle_connections_evict_the_oldest_instead_of_locking_clients_out() -> None:
    import uvicorn

    config = uvicorn.Config(create_app(ThresholdModel()), host="127.0.0.1", port=0, log_level="warning",
                            lifespan="off", http=guarded_protocol(idle_timeout=30.0, max_connections=8))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="evict-loop", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    socks = []
    try:
        for _ in range(20):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=3))
            time.sleep(0.01)
        t0 = time.monotonic()
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 2.0
        assert closed_by_server(socks[0])  # the oldest idle ones made room
        socks[-1].settimeout(0.3)
        assert not closed_by_server(socks[-1])  # the newest stays
    finally:
        for s in socks:
            s.close()
        server.should_exit = True
        thread.join(10)


def test_a_client_that_never_reads_its_response_is_dropped_and_others_are_served() -> None:
    request = _big_segment_request()
    app = create_app(ThresholdModel(), Limits(max_in_flight=1))
    with BackgroundServer(app, limit_concurrency=None, send_timeout=1.0) as server, \
            captured_logs("uvicorn.error") as records:
        stalled = small_window_socket(_port(server))
        try:
            stalled.sendall(request)
            sent = time.time()
            assert wait_for_bytes(stalled, 20), "the big answer never started"
            # meanwhile: light routes and an image request (the only in-flight slot) are served
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
            assert _upload(server.url).status_code == 200
            dropped = wait_for_log(records, DROPPED, 10)
            assert dropped is not None, "the non-reading client was never dropped"
            assert dropped.created - sent >= 0.9
            assert dropped.levelno == logging.WARNING and "send timeout 1 s" in dropped.getMessage()
            got = read_until_closed(stalled, 10)
            assert got is not None, "the server did not close the connection"
            assert got.startswith(b"HTTP/1.1 200") and len(got) < response_length(got), len(got)  # cut short
        finally:
            stalled.close()
        assert _upload(server.url).status_code == 200  # afterwards too, with the slot free
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    assert sum(DROPPED in r.getMessage() for r in records) == 1


def test_a_slow_but_steady_reader_gets_the_whole_big_answer() -> None:
    request = _big_segment_request()
    with BackgroundServer(create_app(ThresholdModel()), limit_concurrency=None, send_timeout=1.0) as server, \
            captured_logs("uvicorn.error") as records:
        with small_window_socket(_port(server), rcvbuf=64 * 1024, timeout=10) as sock:
            sock.sendall(request)
            assert wait_for_bytes(sock, 20), "the answer never started"
            t0 = time.monotonic()
            data = bytearray()
            while chunk := sock.recv(128 * 1024):
                data += chunk
                if len(data) > 100 and len(data) >= response_length(bytes(data[:4096])):
                    break
                time.sleep(0.025)  # at most 128 KiB per 25 ms: 2 s or more for the 10 MB
            took = time.monotonic() - t0
        assert len(data) == response_length(bytes(data[:4096])), len(data)
        assert json.loads(bytes(data).partition(b"\r\n\r\n")[2])["image_size"] == [1536, 1536]
        assert took > 1.5, took  # longer than the send timeout: progress restarts the deadline
    assert not [r for r in records if DROPPED in r.getMessage()]


def test_send_timeout_drops_are_logged_once_per_interval() -> None:
    log = logging.getLogger("cxrground.test.send")
    log.propagate = False
    handler = LogRecords()
    log.addHandler(handler)
    throttle = LogThrottle(interval=60.0)
    try:
        logged = [throttle.warning(log, f"dropped the connection of client {i}") for i in range(500)]
        throttle._last -= 61.0  # the interval has passed
        assert throttle.warning(log, "dropped the connection of client 500")
    finally:
        log.removeHandler(handler)
    assert logged == [True] + [False] * 499
    messages = [r.getMessage() for r in handler.records]
    assert messages == ["dropped the connection of client 0",
                        "dropped the connection of client 500 (499 more since the last such line not logged)"]
    with pytest.raises(ValueError):
        guarded_protocol(send_timeout=0)
    assert guarded_protocol(send_timeout=2.0).send_log is not guarded_protocol(send_timeout=2.0).send_log


def test_a_body_that_never_arrives_gets_408_and_the_connection_closes() -> None:
    app = create_app(ThresholdModel(), Limits(body_timeout_s=1.0))
    with BackgroundServer(app, limit_concurrency=None) as server, \
            socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
        sock.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"image\": ")
        t0 = time.monotonic()
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"request_timeout" in answer and 0.8 <= time.monotonic() - t0 < 4.0


@pytest.mark.parametrize("route", ["/v1/segment", "/v1/chat/completions"])
@pytest.mark.parametrize("body", [b'{"image": ' + b"9" * 5000 + b', "instruction": "x"}',
                                  b'{"image": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"],
                         ids=["huge-integer", "deep-nesting"])
def test_bad_json_is_400_without_a_traceback(route, body) -> None:
    with BackgroundServer(create_app(ThresholdModel())) as server, \
            captured_logs("uvicorn.error", "uvicorn", "starlette", "fastapi") as records:
        resp = httpx.post(server.url + route, content=body, headers={"Content-Type": "application/json"},
                          timeout=20)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["type"] == "invalid_request" and "Traceback" not in error["message"]
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info], records


def test_a_client_vanishing_mid_body_leaves_no_traceback() -> None:
    with BackgroundServer(create_app(ThresholdModel())) as server, \
            captured_logs("uvicorn.error", "uvicorn", "starlette", "fastapi") as records:
        for route in ("/v1/segment", "/v1/chat/completions"):
            with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
                sock.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             "Content-Length: 1000\r\n\r\n{\"image\": ".encode())
                time.sleep(0.2)
        time.sleep(0.5)
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage()[:200] for r in records]


def test_no_swagger_or_redoc_pages_but_the_openapi_document() -> None:
    with BackgroundServer(create_app(ThresholdModel())) as server, \
            httpx.Client(base_url=server.url, timeout=10) as client:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            resp = client.get(path)
            assert resp.status_code == 404 and "cdn" not in resp.text, path
        doc = client.get("/openapi.json").json()
    assert doc["info"]["title"] == "cxrground"
    # the two prediction routes read their bodies themselves: the document still describes them
    schemas = doc["components"]["schemas"]
    segment, chat = doc["paths"]["/v1/segment"]["post"], doc["paths"]["/v1/chat/completions"]["post"]
    assert segment["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SegmentRequest"}
    assert "image" in segment["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert segment["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/SegmentResponse")
    assert chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert {"SegmentRequest", "SegmentResponse", "ChatCompletionRequest", "ChatCompletion", "ChatMessage",
            "ErrorResponse", "RleMask"} <= set(schemas)
    refs = {v for v in _walk(doc) if isinstance(v, str) and v.startswith("#/")}
    assert all(ref.removeprefix("#/components/schemas/") in schemas for ref in refs), refs
    openapi_spec_validator = pytest.importorskip("openapi_spec_validator")
    openapi_spec_validator.validate(doc)


def _walk(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)
    else:
        yield node


def test_max_in_flight_from_the_command_line(monkeypatch, tmp_path) -> None:
    from click.testing import CliRunner

    import cxrground.serve.run as run
    from cxrground.cli import main

    calls = []
    monkeypatch.setattr(run, "serve", lambda checkpoint, **kw: calls.append(kw))
    (tmp_path / "checkpoint.json").write_text('{"model": "baseline"}')
    res = CliRunner().invoke(main, ["serve", "--checkpoint", str(tmp_path), "--max-in-flight", "3"])
    assert res.exit_code == 0, res.output
    assert calls[-1]["limits"].max_in_flight == 3
    assert CliRunner().invoke(main, ["serve", "--checkpoint", str(tmp_path)]).exit_code == 0
    assert calls[-1]["limits"].max_in_flight == 2
    with pytest.raises(ValueError):
        Limits(max_in_flight=0)


def test_accept_errors_are_logged_once_per_interval_without_a_traceback() -> None:
    log = logging.getLogger("cxrground.test.accept")
    log.propagate = False
    handler = LogRecords()
    log.addHandler(handler)
    log.addFilter(AcceptErrorFilter(interval=60.0))
    try:
        error = OSError(24, "Too many open files")
        for _ in range(2000):  # what asyncio logs per failed accept
            log.error("socket.accept() out of system resource\nsocket: <socket>", exc_info=(OSError, error, None))
        late = ValueError("Invalid file descriptor: -1")  # the accept retry after shutdown closed the socket
        log.error("Exception in callback BaseSelectorEventLoop._start_serving(<function>, <socket>)",
                  exc_info=(ValueError, late, None))
        log.error("something else")
    finally:
        log.removeHandler(handler)
    messages = [r.getMessage() for r in handler.records]
    assert len(messages) == 2 and messages[1] == "something else", messages
    assert "Too many open files" in messages[0] and "\n" not in messages[0]
    assert handler.records[0].exc_info is None


def test_prepare_process_raises_the_open_file_limit_and_filters_asyncio_once() -> None:
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    asyncio_log = logging.getLogger("asyncio")
    filters = list(asyncio_log.filters)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
        prepare_process()
        prepare_process()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
        assert sum(isinstance(f, AcceptErrorFilter) for f in asyncio_log.filters) == 1
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        asyncio_log.filters[:] = filters



def test_bodies_held_at_once_are_bounded_and_the_refusal_closes_the_connection() -> None:
    # a body of at most ~336 KB; 3 bodies may be held; no wait for room
    limits = Limits(max_upload_bytes=60_000, max_in_flight=1, busy_wait_s=0)
    app = create_app(ThresholdModel(), limits)
    held = limits.max_bodies_bytes
    with BackgroundServer(app, limit_concurrency=None) as server:
        socks = []
        try:
            head = (b"POST /v1/segment HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % (limits.max_body_bytes - 100))
            part = b'{"image": "' + b"A" * (limits.max_body_bytes // 2)
            refused = b""
            for _ in range(2 * held // len(part) + 2):  # half-sent bodies until the budget is spent
                sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=5)
                socks.append(sock)
                sock.sendall(head + part)
                time.sleep(0.05)
                sock.settimeout(0.3)
                try:
                    refused = sock.recv(4096)
                except TimeoutError:
                    continue
                if refused:
                    break
            assert refused.startswith(b"HTTP/1.1 503"), refused[:200]
            assert b"connection: close" in refused.lower() and b"receiving other large requests" in refused
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        finally:
            for sock in socks:
                sock.close()
        time.sleep(0.3)  # the held bodies are given back when their requests end
        assert _upload(server.url).status_code == 200


def test_an_oversize_chunked_body_gets_413_and_the_connection_closes() -> None:
    limits = Limits(max_upload_bytes=10_000)
    with BackgroundServer(create_app(ThresholdModel(), limits), limit_concurrency=None) as server, \
            socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
        sock.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"A" * 20_000
        try:
            for _ in range(limits.max_body_bytes // len(chunk) + 5):  # past the body limit, never finished
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass
        answer = read_until_closed(sock, 5.0)
        assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower(), answer[:300]


def test_a_deflated_dicom_multi_frame_bombs_and_strips_are_refused_before_decoding(tmp_path) -> None:
    import pydicom
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    from cxrground.io.dicom import write_dicom
    from cxrground.serve.decode import decode_image_bytes
    from cxrground.serve.limits import ApiError

    path = write_dicom(tmp_path / "d.dcm", np.zeros((64, 64), np.uint16))
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    ds.save_as(tmp_path / "deflated.dcm", enforce_file_format=True)
    with pytest.raises(ApiError, match="deflated transfer syntax is not read") as err:
        decode_image_bytes((tmp_path / "deflated.dcm").read_bytes(), Limits())
    assert err.value.status == 400
    ds = pydicom.dcmread(path)
    ds.NumberOfFrames = 50
    ds.PixelData = bytes(64 * 64 * 2 * 50)
    ds.save_as(tmp_path / "frames.dcm")
    with pytest.raises(ApiError, match=r"in 50 frames or samples = 204800 pixels") as err:
        decode_image_bytes((tmp_path / "frames.dcm").read_bytes(), Limits(max_pixels=100_000))
    assert err.value.status == 413
    with pytest.raises(ApiError, match=r"sides more than 8:1 apart") as err:
        decode_image_bytes(png_bytes(np.zeros((4, 4000), np.uint8)), Limits())
    assert err.value.status == 400


def test_stalled_bodies_are_dropped_to_make_room_instead_of_keeping_everyone_out() -> None:
    # a few clients send most of a large body and stop: a new request waits for room, and once their bodies have
    # stalled it is answered (one stalled body gets 408 and its connection closes) rather than 503
    limits = Limits(max_upload_bytes=60_000, max_in_flight=1)
    held = limits.max_bodies_bytes
    part_size = (held - 500) // 3  # three bodies leave too little room for any image request
    assert part_size < limits.max_body_bytes - 100
    with BackgroundServer(create_app(ThresholdModel(), limits), limit_concurrency=None) as server:
        head = (b"POST /v1/segment HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % (limits.max_body_bytes - 100))
        socks = [socket.create_connection(("127.0.0.1", _port(server)), timeout=5) for _ in range(3)]
        try:
            for sock in socks:
                sock.sendall(head + b'{"image": "' + b"A" * (part_size - 11))
            time.sleep(0.3)  # the server has the bodies; they stall while the next request waits for room
            answer = _upload(server.url)
            assert answer.status_code == 200, answer.text
            dropped = [a for a in (read_until_closed(s, 2.0) for s in socks) if a]
            assert len(dropped) == 1, dropped
            assert dropped[0].startswith(b"HTTP/1.1 408") and b"connection: close" in dropped[0].lower()
            assert b"stalled" in dropped[0]
        finally:
            for sock in socks:
                sock.close()


def test_a_request_whose_client_left_while_it_waited_is_not_worked_on() -> None:
    model = _StallModel()
    app = create_app(model, Limits(max_in_flight=1, body_timeout_s=0.5))
    with BackgroundServer(app, limit_concurrency=None) as server:
        first: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: first.append(_upload(server.url)))
        worker.start()
        try:
            assert model.entered.wait(5), "the first request never reached the model"
            body = json.dumps({"image": data_url(png_bytes(cxr_pixels())), "instruction": INSTRUCTION}).encode()
            with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as gone:
                gone.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                time.sleep(0.3)  # the server has read the body; the request waits for the slot
            waiting: list[httpx.Response] = []
            patient = threading.Thread(target=lambda: waiting.append(_upload(server.url)))
            patient.start()
            time.sleep(0.8)  # it waits in the queue longer than the body timeout
        finally:
            model.release.set()
            worker.join(20)
        patient.join(20)
        assert [r.status_code for r in first] == [200]
        assert [r.status_code for r in waiting] == [200], waiting[0].text if waiting else None
        time.sleep(0.3)
        assert model.calls == 2  # the first and the patient one: the request whose client left never ran


def test_the_body_deadline_ends_once_the_body_is_in() -> None:
    # after the body, a receive waits for the client to go (a handler asking whether it is still there): not timed
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}, {"type": "http.disconnect"}]
    seen: list[str] = []

    async def receive() -> dict:
        message = messages.pop(0)
        if message["type"] == "http.disconnect":
            await asyncio.sleep(0.3)  # the client goes long after the deadline
        return message

    async def app(scope, receive, send) -> None:
        seen.append((await receive())["type"])
        seen.append((await receive())["type"])

    asyncio.run(BodyDeadline(app, timeout=0.1)({"type": "http"}, receive, None))
    assert seen == ["http.request", "http.disconnect"]


def test_a_body_that_does_not_arrive_in_time_still_times_out() -> None:
    async def receive() -> dict:
        await asyncio.sleep(1)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def app(scope, receive, send) -> None:
        await receive()

    with pytest.raises(BodyTimeout):
        asyncio.run(BodyDeadline(app, timeout=0.1)({"type": "http"}, receive, None))


@pytest.mark.parametrize("tail", [b"", bytes(range(256)) * 8], ids=["marker only", "garbage"])
def test_a_dicom_without_an_image_is_named_so_without_internal_names(tail) -> None:
    with pytest.raises(app_module.ApiError) as err:
        decode_image_bytes(b"\0" * 128 + b"DICM" + tail, Limits())
    assert err.value.status == 400 and "has no Rows" in err.value.message, err.value.message
    assert "Error" not in err.value.message and "FileDataset" not in err.value.message


@pytest.mark.parametrize(("raw", "reason"), [(b"GARBAGE\r\n\r\n", "invalid HTTP request"),
                                             (b"GET /health HTTP/1.1\r\n\r\n", "Host")],
                         ids=["not http", "no host"])
def test_bytes_that_are_no_http_request_get_a_json_400_and_the_connection_closes(raw, reason) -> None:
    with BackgroundServer(create_app(ThresholdModel()), limit_concurrency=None) as server, \
            socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
        sock.sendall(raw)
        answer = read_until_closed(sock, 5.0)
        assert answer is not None and answer.startswith(b"HTTP/1.1 400"), answer
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head.lower() and b"connection: close" in head.lower()
        error = json.loads(body)["error"]
        assert error["type"] == "invalid_request" and reason in error["message"], error
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_stopping_does_not_wait_for_a_body_that_is_not_arriving() -> None:
    # graceful shutdown finishes requests in progress, but a half-sent body is cut, not waited for (body timeout 60 s)
    model = _StallModel()
    server = BackgroundServer(create_app(model, Limits(body_timeout_s=60)), limit_concurrency=None,
                              stop_timeout=30).start()
    working: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: working.append(_upload(server.url)))
    worker.start()
    try:
        assert model.entered.wait(5), "the request never reached the model"
        with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
            sock.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"image\"")
            time.sleep(0.3)
            stopper = threading.Thread(target=server.stop)
            t0 = time.monotonic()
            stopper.start()
            answer = read_until_closed(sock, 20.0)
            model.release.set()
            stopper.join(40)
            took = time.monotonic() - t0
    finally:
        model.release.set()
        worker.join(20)
    assert answer is not None and answer.startswith(b"HTTP/1.1 503"), answer
    assert b"shutting_down" in answer
    assert took < 20  # not the body timeout
    assert [r.status_code for r in working] == [200]  # the request in the model was finished and answered
