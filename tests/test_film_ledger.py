"""The film ledger (:mod:`cxrground.io.film_ledger`): a film is the same while its size and time are, or its content."""

from __future__ import annotations

import json
import os

from cxrground.io.film_ledger import FilmLedger, FilmState


def _film(path, data: bytes, mtime_ns: int = 1_700_000_000_000_000_000):
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_compare_reads_the_content_only_when_size_or_time_differ(tmp_path):
    film = _film(tmp_path / "a.png", b"film one")
    ledger = FilmLedger(tmp_path / "films.jsonl")
    assert ledger.compare("a.png", film) == "unrecorded"
    ledger.record("a.png", FilmState.of(film))
    assert ledger.compare("a.png", film) == "same"
    # the same bytes under another time (a copy without -p): the same film, and the new time is recorded
    _film(film, b"film one", mtime_ns=1_800_000_000_000_000_000)
    assert ledger.compare("a.png", film) == "same"
    assert ledger.get("a.png").mtime_ns == 1_800_000_000_000_000_000
    assert FilmLedger(tmp_path / "films.jsonl").get("a.png") == ledger.get("a.png")  # the last line wins on reload
    # other bytes of the same size and another time: changed; another size: changed without reading
    _film(film, b"film two", mtime_ns=1_900_000_000_000_000_000)
    assert ledger.compare("a.png", film) == "changed"
    _film(film, b"a longer film")
    assert ledger.compare("a.png", film) == "changed"
    film.unlink()
    assert ledger.compare("a.png", film) == "missing"


def test_same_bytes_at_the_same_time_but_not_the_recorded_size_is_changed(tmp_path):
    film = _film(tmp_path / "a.png", b"abc")
    ledger = FilmLedger(tmp_path / "films.jsonl")
    ledger.record("a.png", FilmState(size=4, mtime_ns=film.stat().st_mtime_ns, sha256="0" * 64))
    assert ledger.compare("a.png", film) == "changed"


def test_a_torn_last_line_and_foreign_lines_are_ignored(tmp_path):
    film = _film(tmp_path / "a.png", b"film")
    path = tmp_path / "films.jsonl"
    FilmLedger(path).record("a.png", FilmState.of(film))
    FilmLedger(path).record("a.png", FilmState.of(film))  # the recorded state is not written twice
    assert len(path.read_text().splitlines()) == 1
    with path.open("a") as fh:
        fh.write('["not", "a", "record"]\n{"film": "b.png", "size": "x"}\n{"film": "c.png", "si')
    ledger = FilmLedger(path)
    assert len(ledger) == 1 and ledger.compare("a.png", film) == "same"
    assert path.read_text().endswith("}\n")  # the torn tail is cut off, so the next line starts afresh
    ledger.record("c.png", FilmState.of(film))
    assert [json.loads(line)["film"] for line in path.read_text().splitlines()[-1:]] == ["c.png"]


def test_a_film_recorded_just_after_its_change_is_compared_by_content(tmp_path):
    import time

    film = tmp_path / "a.png"
    film.write_bytes(b"film one")  # modified now: a same-size rewrite within the clock's resolution keeps the time
    ledger = FilmLedger(tmp_path / "films.jsonl")
    state = FilmState.of(film)
    assert state.racy
    ledger.record("a.png", state)
    assert json.loads((tmp_path / "films.jsonl").read_text())["racy"] is True
    mtime = film.stat().st_mtime_ns
    film.write_bytes(b"film two")
    os.utime(film, ns=(mtime, mtime))  # the same size and time, other content
    assert ledger.compare("a.png", film) == "changed"
    old = time.time_ns() - 10_000_000_000
    os.utime(film, ns=(old, old))
    ledger.record("a.png", FilmState.of(film))
    assert not ledger.get("a.png").racy and ledger.compare("a.png", film) == "same"


def test_a_forgotten_film_is_unrecorded_again(tmp_path):
    film = _film(tmp_path / "a.png", b"film")
    ledger = FilmLedger(tmp_path / "films.jsonl")
    ledger.record("a.png", FilmState.of(film))
    ledger.forget("a.png")
    assert ledger.compare("a.png", film) == "unrecorded"
    assert FilmLedger(tmp_path / "films.jsonl").get("a.png") is None  # the forgetting is on file
