"""Helpers for tests and load scripts that start servers: log capture, socket and process checks."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
from collections.abc import Iterator

__all__ = ["LogRecords", "captured_logs", "closed_by_server", "stop_process"]


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
