"""Helpers for tests and load scripts that start servers: log capture, socket and process checks, clients that
read their responses slowly or not at all."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["LogRecords", "captured_logs", "closed_by_server", "read_until_closed", "response_length",
           "server_thread", "small_window_socket", "stop_process", "wait_for_bytes", "wait_for_log"]


class LogRecords(logging.Handler):
    """A logging handler that keeps every record it is given (``records``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def captured_logs(*names: str) -> Iterator[list[logging.LogRecord]]:
    """Records of the named loggers while the block runs (attached directly: uvicorn's loggers do not propagate to
    the root)."""
    handler = LogRecords()
    for name in names:
        logging.getLogger(name).addHandler(handler)
    try:
        yield handler.records
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(handler)


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server has closed ``sock`` (it reads EOF or a reset within the socket's timeout)."""
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate ``proc`` and wait for it; kill it when it has not ended within ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def small_window_socket(port: int, rcvbuf: int = 4096, timeout: float = 5.0, host: str = "127.0.0.1") -> socket.socket:
    """A client socket connected to ``host:port`` with a receive buffer of about ``rcvbuf`` bytes (set before
    connecting, so the TCP window stays small): a server's response to it piles up on the server's side unless the
    test reads it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect((host, port))
    return sock


def wait_for_bytes(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True once ``sock`` has bytes to read, within ``timeout`` seconds; reads nothing (``MSG_PEEK``), so the
    window the client advertises stays as it is."""
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except TimeoutError:
        return False
    finally:
        sock.settimeout(previous)


def read_until_closed(sock: socket.socket, timeout: float = 10.0) -> bytes | None:
    """Everything ``sock`` receives until the server closes it (EOF or a reset); None when it is still open after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    data = bytearray()
    try:
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(1 << 16)
            if not chunk:
                return bytes(data)
            data += chunk
            if time.monotonic() > deadline:
                return None
    except (ConnectionResetError, BrokenPipeError):
        return bytes(data)
    except TimeoutError:
        return None


def response_length(data: bytes) -> int:
    """The length of the first HTTP response in ``data`` as its head declares it (head plus Content-Length)."""
    head, sep, _ = data.partition(b"\r\n\r\n")
    if not sep:
        raise ValueError("no complete response head")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + len(sep) + int(value)
    raise ValueError("the response head has no Content-Length")


def wait_for_log(records: list[logging.LogRecord], text: str, timeout: float) -> logging.LogRecord | None:
    """The first of ``records`` whose message holds ``text``, waiting up to ``timeout`` seconds; None if none came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r for r in list(records) if text in r.getMessage()]
        if found:
            return found[0]
        time.sleep(0.05)
    return None


@contextlib.contextmanager
def server_thread(server: Any, name: str = "server-loop", start_timeout: float = 20.0
                  ) -> Iterator[tuple[int, list[logging.LogRecord]]]:
    """Run a ``uvicorn.Server`` in a daemon thread until the block ends; yields (its port, the records of uvicorn's
    error log while it runs). Made after the server's config, since uvicorn sets its loggers up there."""
    records = LogRecords()
    logging.getLogger("uvicorn.error").addHandler(records)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        yield int(server.servers[0].sockets[0].getsockname()[1]), records.records
    finally:
        server.should_exit = True
        thread.join(10)
        logging.getLogger("uvicorn.error").removeHandler(records)
