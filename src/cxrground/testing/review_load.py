"""A load run against the review app as ``cxrground review serve`` starts it (own process, 127.0.0.1 only):
reviewers with keep-alive clients deciding every item of their queue, idle connections held open beside them,
and optionally a flood of wrong-token requests. Used by ``tests/test_review_load.py`` and ``bench/review_load.py``.

Every decision is counted as acknowledged (200), refused (any other status or a connection error) and, after
the run, found or lost in the database; latencies are per decision request, client-side.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cxrground.review.db import ReviewDB
from cxrground.testing.servers import stop_process

__all__ = ["LoadResult", "load_db", "run_load", "served"]


@dataclass
class LoadResult:
    """What a load run saw."""

    decisions: int = 0
    acknowledged: int = 0
    refused: int = 0
    lost: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    flood_requests: int = 0
    flood_other: int = 0
    """Flood answers other than 401 (a 503 or a connection error would mean the flood shut reviewers out)."""
    seconds: float = 0.0

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of the decision latencies, in ms."""
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]

    def summary(self) -> str:
        """One line of numbers."""
        return (f"{self.decisions} decisions in {self.seconds:.1f} s: {self.acknowledged} acknowledged, "
                f"{self.refused} refused, {self.lost} lost; latency p50 {self.percentile(50):.0f} ms, "
                f"p95 {self.percentile(95):.0f} ms, max {max(self.latencies_ms, default=0):.0f} ms; "
                f"flood {self.flood_requests} requests, {self.flood_other} not 401")


def load_db(folder: Path, reviewers: int = 8, items: int = 400) -> tuple[ReviewDB, dict[str, str]]:
    """A review database in ``folder`` with ``reviewers`` reviewers and ``items`` negative ILS pairs (one
    reviewer each; they share one 8x8 film, which the app reads once to check that an accepted film can be shown)."""
    from PIL import Image

    film = folder / "film.png"
    Image.new("L", (8, 8), 128).save(film)
    db = ReviewDB.create(folder / "load.sqlite")
    tokens = {f"r{i}": db.add_user(f"r{i}")[1] for i in range(reviewers)}
    rows = [{"kind": "ils", "key": f"load_{i:05d}", "lesion": "nodule", "item_type": "basic negative",
             "positive": False, "source": str(folder), "height": 8, "width": 8,
             "images": [{"path": str(film), "role": "cxr", "label": "CXR"}], "mask": None,
             "payload": {"pair_id": f"p{i}", "instruction": "Segment the nodule.", "answer": "[SEG] none.",
                         "parts": ["pair"]}} for i in range(items)]
    db.add_and_assign(rows, 1)
    return db, tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served(db_path: Path, *, start_timeout: float = 60.0) -> Iterator[str]:
    """``cxrground review serve`` on the database in a child process on 127.0.0.1; yields its URL."""
    import httpx

    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "cxrground", "review", "serve", "--db", str(db_path),
                             "--host", "127.0.0.1", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"review serve exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("review serve did not answer /healthz in time")
            time.sleep(0.1)
        yield url
    finally:
        stop_process(proc)


def run_load(db: ReviewDB, tokens: dict[str, str], url: str, *, idle: int = 32, flood: int = 0,
             timeout: float = 30.0) -> LoadResult:
    """Each reviewer decides its whole queue (alternating accept and reject) over one keep-alive client while
    ``idle`` connections stay open without a request and ``flood`` clients send wrong tokens until the reviewers
    are done; then every acknowledged decision is looked up in the database."""
    import httpx

    result = LoadResult()
    lock = threading.Lock()
    acknowledged: list[tuple[int, str]] = []
    done = threading.Event()
    host, port = url.rsplit("//", 1)[1].split(":")
    sockets = [socket.create_connection((host, int(port)), timeout=5) for _ in range(idle)]

    def reviewer(token: str) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout) as c:
            queue = c.get("/api/queue").json()["assignments"]
            for k, a in enumerate(queue):
                body: dict[str, Any] = {"part": "pair", "decision": "accept" if k % 2 == 0 else "reject",
                                        "reason": "" if k % 2 == 0 else "wrong location"}
                t0 = time.perf_counter()
                try:
                    status = c.post(f"/api/assignments/{a['id']}/decision", json=body).status_code
                except httpx.HTTPError:
                    status = 0
                ms = 1000 * (time.perf_counter() - t0)
                with lock:
                    result.decisions += 1
                    result.latencies_ms.append(ms)
                    if status == 200:
                        result.acknowledged += 1
                        acknowledged.append((a["id"], body["decision"]))
                    else:
                        result.refused += 1

    def flooder() -> None:
        with httpx.Client(base_url=url, timeout=timeout) as c:
            while not done.is_set():
                bad = f"rv{secrets.randbelow(9) + 1}_{secrets.token_urlsafe(32)}"
                try:
                    status = c.get("/api/queue", headers={"Authorization": f"Bearer {bad}"}).status_code
                except httpx.HTTPError:
                    status = 0
                with lock:
                    result.flood_requests += 1
                    result.flood_other += status != 401

    floods = [threading.Thread(target=flooder, daemon=True) for _ in range(flood)]
    workers = [threading.Thread(target=reviewer, args=(t,), daemon=True) for t in tokens.values()]
    t0 = time.perf_counter()
    try:
        for t in floods + workers:
            t.start()
        for t in workers:
            t.join(timeout * 20)
    finally:
        done.set()
        for t in floods:
            t.join(timeout)
        result.seconds = time.perf_counter() - t0
        for s in sockets:
            s.close()
    stored = {a.id: a.decisions.get("pair", {}).get("decision") for a in db.assignments()}
    result.lost = sum(stored.get(aid) != decision for aid, decision in acknowledged)
    return result
