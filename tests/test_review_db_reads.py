"""Reads and rewrites of a review database beside the app: ``review relink`` (a review whose images moved is pointed
at their new folder, checked first, in one step) and the queue read that lists assignments without their items."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("fastapi")

from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.review.relink import relink, stored_roots
from review_helpers import review_setup


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


def _paths(db) -> dict[int, list[str]]:
    return {i.id: [im["path"] for im in i.images] for i in db.items()}


def test_moved_images_are_relinked_and_served_from_the_new_folder(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    moved = tmp_path / "moved-images"
    shutil.copytree(setup.images, moved)
    before = _paths(db)
    ils_ids = {i.id for i in db.items() if i.kind == "ils"}
    decisions = json.dumps([a.decisions for a in db.assignments()])

    res = CliRunner().invoke(main, ["review", "relink", "--db", str(db.path), "--from", str(setup.images),
                                    "--to", str(moved), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "would rewrite 6 image path(s)" in res.output and "dry run: nothing was changed" in res.output
    assert _paths(db) == before

    res = CliRunner().invoke(main, ["review", "relink", "--db", str(db.path), "--from", str(setup.images),
                                    "--to", str(moved)])
    assert res.exit_code == 0, res.output
    after = _paths(db)
    for item_id, paths in after.items():
        if item_id in ils_ids:
            assert all(p.startswith(str(moved.resolve())) for p in paths)
            assert [p.replace(str(moved.resolve()), str(setup.images.resolve())) for p in paths] == before[item_id]
        else:  # the benchmark's images lie elsewhere and are left alone
            assert paths == before[item_id]
    assert json.dumps([a.decisions for a in db.assignments()]) == decisions

    listed = CliRunner().invoke(main, ["review", "relink", "--db", str(db.path)])
    assert listed.exit_code == 0 and str(moved.resolve()) in listed.output


def test_a_relink_to_a_folder_missing_images_changes_nothing_unless_allowed(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    partial = tmp_path / "partial"
    shutil.copytree(setup.images, partial)
    victim = next(p for p in sorted(partial.rglob("*")) if p.is_file() and any(
        p.name in im for paths in _paths(db).values() for im in paths))
    victim.unlink()
    before = _paths(db)
    refusal = r"1 image file\(s\) named by the 6 rewritten path\(s\) are not under --to .*nothing was changed"
    with pytest.raises(ConfigError, match=refusal):
        relink(db, setup.images, partial)
    assert _paths(db) == before
    done = relink(db, setup.images, partial, allow_missing=True)
    assert (done.images, len(done.missing)) == (6, 1) and done.missing[0] == str(victim.resolve())


def test_a_from_folder_holding_no_stored_image_names_where_they_are(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    (tmp_path / "new").mkdir()
    with pytest.raises(ConfigError, match="no stored image or source lies under --from") as err:
        relink(db, tmp_path / "elsewhere", tmp_path / "new")
    assert stored_roots(db)[0][0] in str(err.value)
    with pytest.raises(ConfigError, match="not a folder"):
        relink(db, setup.images, tmp_path / "absent")
    res = CliRunner().invoke(main, ["review", "relink", "--db", str(db.path), "--from", str(setup.images)])
    assert res.exit_code == 2 and "give both --from and --to" in res.output


def test_the_queue_read_lists_what_the_full_read_does(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    users = {u.name: u for u in db.users()}
    full = db.assignments()
    bench = next(a for a in full if a.item.kind == "bench" and a.user_name == "alice")
    ils = next(a for a in full if a.item.kind == "ils" and a.user_name == "alice")
    db.record(bench.id, bench.item.parts[0], "accept")  # a case partly decided
    db.record(ils.id, "pair", "reject", "wrong lesion")
    for user in (users["alice"], users["bob"], None):
        want = [(a.id, a.item.key, a.item.kind, a.item.lesion, a.item.item_type, a.user_name, a.position,
                 a.item.parts, sorted(a.decisions), a.done) for a in db.assignments(user)]
        got = [(q.id, q.key, q.kind, q.lesion, q.item_type, q.user_name, q.position, q.parts, q.decided, q.done)
               for q in db.queue(user)]
        assert got == want
    states = {q.id: (q.decided, q.done) for q in db.queue(users["alice"])}
    assert states[bench.id] == ([bench.item.parts[0]], False) and states[ils.id] == (["pair"], True)
