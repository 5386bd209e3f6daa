"""A reviewer sees the pose reader's warning on the pairs of a film it flagged (read from the build's unit record),
and nothing on the others or when the unit record is missing or broken."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("fastapi")

from cxrground.review.app import create_app
from cxrground.review.db import ReviewDB
from cxrground.review.importers import ils_items, import_items
from cxrground.serve.run import BackgroundServer
from percept_build_helpers import synthetic_ils
from review_helpers import browser_login

WARNING = {"correction": "mirrored left-right", "p": 0.97, "p_upright": 0.02}


@pytest.fixture()
def flagged_ils(tmp_path_factory, tmp_path):
    """A copy of the synthetic ILS build whose first train study's unit records a pose warning; (folder, images,
    flagged study, a study whose unit record is broken)."""
    source, images = synthetic_ils(tmp_path_factory)
    ils = tmp_path / "ils"
    shutil.copytree(source, ils)
    studies = sorted(json.loads((ils / "mimic_ils_instruction_answer.json").read_text())["train"])
    flagged, broken = studies[0], studies[1]
    unit = ils / "units" / f"{flagged}.json"
    unit.write_text(json.dumps({**json.loads(unit.read_text()), "pose_warning": WARNING}))
    (ils / "units" / f"{broken}.json").write_text("{torn")
    return ils, images, flagged, broken


def test_ils_items_carry_the_pose_warning_of_their_study(flagged_ils):
    ils, images, flagged, broken = flagged_ils
    items = ils_items(ils, images, ("train",))
    by_study = {}
    for item in items:
        by_study.setdefault(item["payload"]["study"], []).append(item["payload"]["pose_warning"])
    assert by_study[flagged] and all(w == WARNING for w in by_study[flagged])
    assert by_study[broken] and all(w is None for w in by_study[broken])
    assert all(w is None for s, ws in by_study.items() if s != flagged for w in ws)


def test_reviewer_sees_the_pose_warning_only_on_the_flagged_film(page, flagged_ils, tmp_path):
    ils, images, flagged, _ = flagged_ils
    items = ils_items(ils, images, ("train",))
    chosen = [next(i for i in items if i["payload"]["study"] == flagged),
              next(i for i in items if i["payload"]["study"] != flagged)]
    db = ReviewDB.create(tmp_path / "r.sqlite")
    alice, token = db.add_user("alice")
    import_items(db, chosen, None, 0, 1)
    by_study = {a.item.payload["study"]: a.id for a in db.assignments(alice)}
    with BackgroundServer(create_app(db)) as srv:
        browser_login(page, srv.url, "alice", token)
        page.goto(f"{srv.url}/review/{by_study[flagged]}")
        page.wait_for_selector("body[data-ready='true']")
        text = page.inner_text("#pose-warning")
        assert "mirrored left-right" in text and "0.97" in text and "reject" in text
        # the orientation markers are drawn as on any frontal film; the warning says they may be wrong here
        assert page.locator("#stage .orient").all_inner_texts() == ["R", "L"]
        other = next(s for s in by_study if s != flagged)
        page.goto(f"{srv.url}/review/{by_study[other]}")
        page.wait_for_selector("body[data-ready='true']")
        assert page.locator("#pose-warning").count() == 0
    assert not page.console_errors
