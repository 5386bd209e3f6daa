"""The chat client's limits: one deadline per request, a cap on the answer's size, clear reasons for a malformed answer,
the ``finish_reason`` carried, and the response cache's refusal of a file that is not one."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from cxrground.errors import BatchStopped, ConfigError
from cxrground.llm import (
    CacheError,
    ChatClient,
    ClientError,
    PermanentError,
    ResponseCache,
    RetryPolicy,
    TimedOut,
    TransientError,
    call_with_retries,
    run_sync,
)

MSGS = [{"role": "user", "content": "x"}]


def _completion(content: str = "ok", finish: str = "stop") -> bytes:
    return json.dumps({"model": "m", "choices": [{"index": 0, "finish_reason": finish,
                                                  "message": {"role": "assistant", "content": content}}]}).encode()


class DripServer:
    """A raw HTTP server on 127.0.0.1 (ephemeral port) that sends its headers at once, then the body ``step`` bytes
    every ``pause`` seconds: no single read waits long, the whole answer does."""

    def __init__(self, body: bytes, step: int = 8, pause: float = 0.1) -> None:
        self.body, self.step, self.pause = body, step, pause
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(self.body))
                for i in range(0, len(self.body), self.step):
                    if self.stop.is_set():
                        return
                    conn.sendall(self.body[i:i + self.step])
                    time.sleep(self.pause)
            except OSError:
                pass

    def __enter__(self) -> DripServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(timeout=2)


@pytest.fixture
def drip() -> Iterator[DripServer]:
    with DripServer(_completion("x" * 200)) as server:  # about 300 bytes: about 4 s at 8 bytes per 0.1 s
        yield server


def test_the_timeout_is_a_deadline_for_the_whole_request(drip: DripServer) -> None:
    chat = ChatClient(drip.base_url, "m", timeout=0.5)
    started = time.perf_counter()
    with pytest.raises(TimedOut, match=r"timed out after 0\.5 s"):
        run_sync(chat.complete(MSGS))
    assert time.perf_counter() - started < 1.5
    assert chat.answered  # the headers came: the server is there, it is only slow
    assert isinstance(TimedOut("x"), TransientError)  # retried like any timeout


def _streamed(chunks: list[bytes], headers: dict[str, str] | None = None) -> httpx.MockTransport:
    class Body(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

    return httpx.MockTransport(lambda request: httpx.Response(200, headers=headers or {}, stream=Body()))


def test_an_answer_over_the_size_cap_is_a_permanent_error_naming_the_cap() -> None:
    body = _completion("y" * 5000)
    by_length = ChatClient("http://llm.test/v1", "m", max_response_bytes=1000,
                           transport=httpx.MockTransport(lambda request: httpx.Response(200, content=body)))
    with pytest.raises(PermanentError, match=r"over the cap of 1000 bytes .*Content-Length"):
        run_sync(by_length.complete(MSGS))
    read = []
    chunks = [body[i:i + 256] for i in range(0, len(body), 256)]

    class Counting(list):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            for chunk in super().__iter__():
                read.append(len(chunk))
                yield chunk

    streamed = ChatClient("http://llm.test/v1", "m", max_response_bytes=1000,
                          transport=_streamed(Counting(chunks)))  # no Content-Length: stopped while reading
    with pytest.raises(PermanentError, match=r"over the cap of 1000 bytes"):
        run_sync(streamed.complete(MSGS))
    assert sum(read) < 1000 + 2 * 256  # the read stopped at the cap
    small = ChatClient("http://llm.test/v1", "m", max_response_bytes=len(body), transport=_streamed(chunks))
    assert run_sync(small.complete(MSGS)).content == "y" * 5000
    with pytest.raises(ConfigError, match="max_response_bytes"):
        ChatClient("http://llm.test/v1", "m", max_response_bytes=0)


def test_finish_reason_is_carried() -> None:
    chat = ChatClient("http://llm.test/v1", "m", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, content=_completion('{"a": ', "length"))))
    got = run_sync(chat.complete(MSGS))
    assert got.finish_reason == "length" and got.content == '{"a": '
    plain = ChatClient("http://llm.test/v1", "m", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]})))
    assert run_sync(plain.complete(MSGS)).finish_reason is None


@pytest.mark.parametrize(("body", "said"), [
    ({"choices": []}, "'choices' is empty"),
    ({"object": "error"}, "no 'choices' list"),
    ({"choices": [{"text": "hi"}]}, "choices[0] has no 'message' object"),
    ([1, 2], "a JSON list, not an object"),
    (b'{"choices": [{"mess', "not JSON (Unterminated string starting at: line 1 column 15 (char 14))"),
])
def test_a_malformed_answer_says_what_is_wrong(body: object, said: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    chat = ChatClient("http://llm.test/v1", "m", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, content=content)))
    with pytest.raises(TransientError) as got:
        run_sync(chat.complete(MSGS))
    assert said in got.value.reason


def test_the_final_error_counts_attempts_in_good_english_and_keeps_the_last_error() -> None:
    async def fail() -> None:
        raise TimedOut("timed out after 1 s")

    with pytest.raises(ClientError) as one:
        run_sync(call_with_retries(fail, RetryPolicy(max_attempts=1)))
    assert one.value.reason.endswith("(after 1 attempt)") and isinstance(one.value.last, TimedOut)
    with pytest.raises(ClientError) as two:
        run_sync(call_with_retries(fail, RetryPolicy(max_attempts=2, backoff=0.0, max_backoff=0.0)))
    assert two.value.reason.endswith("(after 2 attempts)")


# -- the cache file ---------------------------------------------------------------------------------------------


def _filled(path: Path) -> Path:
    with ResponseCache(path) as cache:
        cache.put("k", "m", {"a": 1}, '{"x": 1}')
    return path


def test_a_file_that_is_not_a_cache_is_refused_naming_it(tmp_path: Path) -> None:
    noise = tmp_path / "noise.sqlite"
    noise.write_bytes(bytes(range(256)) * 20)
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, response TEXT)")
    truncated = tmp_path / "truncated.sqlite"
    full = _filled(tmp_path / "full.sqlite").read_bytes()
    truncated.write_bytes(full[: len(full) // 2] + b"\0" * 100)
    for path, said in ((noise, "file is not a database"), (foreign, "without model, request, created"),
                       (truncated, "")):
        with pytest.raises(CacheError) as got:
            ResponseCache(path)
        assert f"--cache {path}: not a readable SQLite response cache" in str(got.value) and said in str(got.value)
        assert isinstance(got.value, ConfigError) and isinstance(got.value, BatchStopped)
    with ResponseCache(tmp_path / "full.sqlite") as ok:
        assert ok.get("k") == '{"x": 1}' and len(ok) == 1
