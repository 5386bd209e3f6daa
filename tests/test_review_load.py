"""The review app under load, as ``review serve`` runs it (own process, 127.0.0.1 only): 8 reviewers with
keep-alive clients and 32 idle connections decide 400 items, then the same beside a flood of wrong-token requests.
Nothing refused, nothing lost, every assignment done. Latency is a speed goal, so it is measured by
``bench/review_load.py`` (p50/p95/max), not asserted here."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from cxrground.testing.review_load import load_db, run_load, served


@pytest.mark.parametrize("flood", [0, 8], ids=["reviewers", "with-wrong-token-flood"])
def test_eight_reviewers_beside_idle_connections(tmp_path, flood) -> None:
    db, tokens = load_db(tmp_path, reviewers=8, items=400)
    with served(db.path) as url:
        result = run_load(db, tokens, url, idle=32, flood=flood, timeout=30.0)
    print(result.summary())
    assert result.decisions == 400 and result.refused == 0 and result.acknowledged == 400, result.summary()
    assert result.lost == 0, result.summary()
    assert all(a.done for a in db.assignments())
    if flood:
        assert result.flood_requests > 0 and result.flood_other == 0, result.summary()  # 401s, never a 503
