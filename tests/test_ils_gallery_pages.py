"""`ils gallery --per-page N`: more studies than a page holds go on several self-contained pages beside the first
(STEM.p2.html, ...), linked to each other, each with its contents, the filter and an index of every page's studies;
a re-run removes the pages it no longer writes (and only those a gallery wrote); a study not shown stays listed."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.ils.build import DATASET_FILE
from cxrground.ils.gallery import render_gallery
from cxrground.ils.schema import SPLITS


def _images(tasks) -> Path:
    task = tasks[0][0]
    return Path(task.image_path[: -len(task.relative_image_path)])


@pytest.fixture(scope="module")
def dataset(build_tiny_ils, tmp_path_factory) -> Path:
    """The tiny dataset with its 4 studies spread over the splits (2 train, 1 val, 1 test)."""
    ds = build_tiny_ils(tmp_path_factory.mktemp("pages") / "ils")
    data = json.loads((ds / DATASET_FILE).read_text())
    studies = [(key, study) for split in SPLITS for key, study in data.get(split, {}).items()]
    assert len(studies) == 4
    data.update(train=dict(studies[:2]), val=dict(studies[2:3]), test=dict(studies[3:]))
    (ds / DATASET_FILE).write_text(json.dumps(data))
    return ds


def _keys(ds: Path) -> list[str]:
    data = json.loads((ds / DATASET_FILE).read_text())
    return [key for split in SPLITS for key in data.get(split, {})]


def _blocks(text: str) -> list[str]:
    """The study ids of a page's study blocks, in page order."""
    return re.findall(r"<div class='study(?: failed)?' id='([^']*)'", text)


def _links(text: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(r"<a [^>]*href='([^']*)'", text)]


def test_studies_spread_over_linked_pages_each_once(dataset, tiny_ils_tasks, tmp_path):
    keys = _keys(dataset)
    out = tmp_path / "g.html"
    result = render_gallery(dataset, _images(tiny_ils_tasks), out, limit=10, per_page=1)
    names = ["g.html", "g.p2.html", "g.p3.html", "g.p4.html"]
    assert result.shown == 4 and [p.name for p in result.pages] == names and result.removed == ()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    texts = {name: (tmp_path / name).read_text() for name in names}
    placed = [key for name in names for key in _blocks(texts[name])]
    assert placed == keys  # each study exactly once, in file order, one a page
    for i, name in enumerate(names):
        text = texts[name]
        assert "<meta name='cxrground-gallery' content='g.html'>" in text
        assert f"<title>ILS dataset: ils · page {i + 1} of 4</title>" in text
        assert text.count("<nav class='pages'>") == 2 and f"Page {i + 1} of 4, study {i + 1} of 4" in text
        assert ("rel='prev'" in text) == (i > 0) and ("rel='next'" in text) == (i < 3)
        if i:
            assert f"<a class='pg' href='{names[i - 1]}' rel='prev'>" in text
        if i < 3:
            assert f"<a class='pg' href='{names[i + 1]}' rel='next'>" in text
        assert f"<b aria-current='page'>{i + 1}</b>" in text
        for href in _links(text):  # every link leads to a page of the gallery and a place on it
            target, _, anchor = href.partition("#")
            assert "?" not in target and (target == "" or unquote(target) in names), href
            if anchor:
                assert f" id='{anchor}'" in texts[unquote(target) or name], href
        contents = text.split("<summary>Contents of page", 1)[1].split("</details>", 1)[0]
        assert re.findall(r">(s\d+)</a>", contents) == [keys[i]]  # the contents cover this page
        index = text.split("<details class='toc' id='index'>", 1)[1].split("</details>", 1)[0]
        assert re.findall(r">(s\d+)</a>", index) == keys  # the index: every study, by page
        for j, key in enumerate(keys):
            want = f"#{key}" if j == i else f"{names[j]}#{key}"
            assert f"href='{want}'" in index
        for split in ("train", "val", "test"):  # the filter offers every split of the gallery on every page
            assert f"<option value='{split}'>{split}</option>" in text
        assert text.count("<script>") == 1 and "http://" not in text and "https://" not in text


def test_one_page_when_everything_fits(dataset, tiny_ils_tasks, tmp_path):
    images = _images(tiny_ils_tasks)
    one = render_gallery(dataset, images, tmp_path / "a" / "g.html", limit=4, per_page=4)
    plain = render_gallery(dataset, images, tmp_path / "b" / "g.html", limit=4)
    assert [p.name for p in one.pages] == ["g.html"] and list((tmp_path / "a").iterdir()) == [tmp_path / "a" / "g.html"]
    text = (tmp_path / "a" / "g.html").read_text()
    assert text == (tmp_path / "b" / "g.html").read_text()
    assert "<nav" not in text and "cxrground-gallery" not in text and "id='index'" not in text
    assert "<summary>Contents</summary>" in text and len(_blocks(text)) == 4
    assert plain.pages == (tmp_path / "b" / "g.html",)


def test_a_rerun_with_fewer_pages_removes_only_the_pages_it_wrote(dataset, tiny_ils_tasks, tmp_path):
    images = _images(tiny_ils_tasks)
    out = tmp_path / "g.html"
    render_gallery(dataset, images, out, limit=10, per_page=1)
    mine = "<!doctype html><p>my notes</p>"
    (tmp_path / "g.p7.html").write_text(mine)  # a page's name, but not written by a gallery
    render_gallery(dataset, images, tmp_path / "other.html", limit=10, per_page=2)  # another gallery beside it
    (tmp_path / "g.p9.html").write_text((tmp_path / "other.p2.html").read_text())  # a page of that other gallery
    result = render_gallery(dataset, images, out, limit=10, per_page=2)
    assert [p.name for p in result.pages] == ["g.html", "g.p2.html"]
    assert [p.name for p in result.removed] == ["g.p3.html", "g.p4.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.html", "g.p2.html", "g.p7.html", "g.p9.html",
                                                         "other.html", "other.p2.html"]
    assert [k for name in ("g.html", "g.p2.html") for k in _blocks((tmp_path / name).read_text())] == _keys(dataset)
    res = CliRunner().invoke(main, ["ils", "gallery", str(dataset), "--images", str(images), "--html", str(out)])
    assert res.exit_code == 0, res.output
    assert "removed 1 page of an earlier run past the last: g.p2.html" in res.output
    assert f"wrote {out} (4 studies)" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.html", "g.p7.html", "g.p9.html", "other.html",
                                                         "other.p2.html"]
    assert (tmp_path / "g.p7.html").read_text() == mine


def test_a_file_of_a_pages_name_that_no_gallery_wrote_is_not_replaced(dataset, tiny_ils_tasks, tmp_path):
    images = _images(tiny_ils_tasks)
    mine = "<!doctype html><p>my notes</p>"
    (tmp_path / "g.p2.html").write_text(mine)
    with pytest.raises(ConfigError, match=r"g\.p2\.html exists and is not a page of the gallery g\.html"):
        render_gallery(dataset, images, tmp_path / "g.html", limit=10, per_page=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.p2.html"] and (tmp_path / "g.p2.html").read_text() == mine
    res = CliRunner().invoke(main, ["ils", "gallery", str(dataset), "--images", str(images), "--html",
                                    str(tmp_path / "g.html"), "--per-page", "2"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "g.p2.html exists and is not a page of the gallery g.html" in res.output
    one = render_gallery(dataset, images, tmp_path / "g.html", limit=10, per_page=10)  # one page: nothing in the way
    assert len(one.pages) == 1 and (tmp_path / "g.p2.html").read_text() == mine


def test_a_study_that_cannot_be_shown_is_listed_on_the_first_page(dataset, tiny_ils_tasks, tmp_path):
    data = json.loads((dataset / DATASET_FILE).read_text())
    keys = _keys(dataset)
    broken = keys[3]  # the test study: after the third, on page 2 of 2 with two studies a page
    copy = tmp_path / "ils"
    copy.mkdir()
    for entry in dataset.iterdir():
        (copy / entry.name).symlink_to(entry)
    (copy / DATASET_FILE).unlink()
    data["test"][broken]["image_path"] = "missing/film.jpg"
    (copy / DATASET_FILE).write_text(json.dumps(data))
    images = _images(tiny_ils_tasks)
    res = CliRunner().invoke(main, ["ils", "gallery", str(copy), "--images", str(images), "--html",
                                    str(tmp_path / "g.html"), "--per-page", "2"])
    assert res.exit_code == 0, res.output
    assert f"wrote {tmp_path / 'g.html'} and 1 more page beside it, g.p2.html (3 studies, 2 a page, 1 not shown)" \
        in res.output
    assert f"study {broken} not shown: " in res.output
    first, second = (tmp_path / "g.html").read_text(), (tmp_path / "g.p2.html").read_text()
    assert _blocks(first) == keys[:2] and _blocks(second) == keys[2:]
    failed = first.split("<p class='failed' id='failed'>", 1)[1].split("</ul>", 1)[0]
    assert failed.startswith("1 of 4 studies could not be shown")
    assert f"<a href='g.p2.html#{broken}' class='pg'>{broken}</a> (page 2): " in failed
    assert "missing/film.jpg" in html.unescape(failed)
    assert ("1 of 4 studies could not be shown (1 on this page, each in its place with the reason): "
            "<a class='pg' href='g.html#failed'>the list on page 1</a>") in second
    assert f"<div class='study failed' id='{broken}'" in second and "not shown: " in second


def test_the_filter_stays_while_paging_in_a_browser(dataset, tiny_ils_tasks, tmp_path, page):
    out = tmp_path / "g.html"
    render_gallery(dataset, _images(tiny_ils_tasks), out, limit=10, per_page=1)
    keys = _keys(dataset)
    page.goto(out.as_uri())
    assert page.console_errors == []
    assert page.locator("#f-count").inner_text() == "1 of 1 studies shown on this page"
    assert page.locator("#index a:visible").count() == 0  # the index is folded
    page.click("#index summary")
    assert page.locator("#index a:visible").count() == 4
    page.select_option("#f-split", "val")  # the val study is on page 3
    assert page.locator(".study:visible").count() == 0
    assert page.locator("#index a:visible").count() == 1
    page.click("nav.pages >> nth=0 >> a[rel='next']")
    page.wait_for_url("**/g.p2.html?split=val")
    assert page.locator("#f-split").input_value() == "val"
    assert page.locator("#f-count").inner_text() == "0 of 1 studies shown on this page"
    page.click("#index summary")
    page.click("#index a[href^='g.p3.html']")
    page.wait_for_url(f"**/g.p3.html?split=val#{keys[2]}")
    assert page.locator(".study:visible").count() == 1 and page.locator("#f-split").input_value() == "val"
    page.select_option("#f-split", "all")
    page.click("nav.pages >> nth=0 >> a[rel='prev']")
    page.wait_for_url("**/g.p2.html")
    assert page.locator(".study:visible").count() == 1
    page.goto(out.as_uri() + "?split=nonsense&finding=%3Cb%3E")  # a choice the page does not offer is ignored
    assert page.locator("#f-split").input_value() == "all" and page.locator(".study:visible").count() == 1
    assert page.console_errors == []


def test_per_page_below_one_is_refused(dataset, tiny_ils_tasks, tmp_path):
    res = CliRunner().invoke(main, ["ils", "gallery", str(dataset), "--images", str(_images(tiny_ils_tasks)),
                                    "--html", str(tmp_path / "g.html"), "--per-page", "0"])
    assert res.exit_code == 2 and "--per-page" in res.output
    with pytest.raises(ConfigError, match="per_page must be at least 1"):
        render_gallery(dataset, _images(tiny_ils_tasks), tmp_path / "g.html", per_page=0)
    assert not (tmp_path / "g.html").exists()


def _study_html(text: str) -> list[str]:
    """Each study block of a page (its whole HTML, thumbnail included), in page order."""
    return re.findall(r"<div class='study(?: failed)?' id='[^']*'.*?</table></div></div>|"
                      r"<div class='study failed' id='[^']*'.*?</div></div>", text, flags=re.S)


def test_the_studies_html_comes_back_whole_from_where_it_waits_for_its_page(dataset, tiny_ils_tasks, tmp_path):
    """Each study's HTML (thumbnail included) waits in a temporary file until its page is written, so that memory
    holds one study's, not every page's: the pages of a paged gallery, and of a sample (made in draw order, shown
    in file order), hold byte for byte the study blocks of the one-page gallery; the temporary file leaves nothing
    behind."""
    images = _images(tiny_ils_tasks)
    render_gallery(dataset, images, tmp_path / "one" / "g.html", limit=10)
    blocks = _study_html((tmp_path / "one" / "g.html").read_text())
    assert len(blocks) == 4 and all("data:image/jpeg;base64," in b for b in blocks)
    paged = render_gallery(dataset, images, tmp_path / "paged" / "g.html", limit=10, per_page=1)
    assert [b for p in paged.pages for b in _study_html(p.read_text())] == blocks
    drawn = render_gallery(dataset, images, tmp_path / "sample" / "g.html", limit=3, sample=5, per_page=2)
    got = [b for p in drawn.pages for b in _study_html(p.read_text())]
    assert len(got) == 3 and all(b in blocks for b in got) and got == [b for b in blocks if b in got]
    assert sorted(p.name for p in (tmp_path / "paged").iterdir()) == ["g.html", "g.p2.html", "g.p3.html", "g.p4.html"]


def test_page_numbers_of_many_pages_are_condensed():
    """Up to ALL_PAGE_LINKS pages the page row links every page; more: the first, the last, two either side of this
    one (a gap of one page shows that page), the others in the index."""
    from cxrground.ils.gallery import ALL_PAGE_LINKS, _page_numbers

    assert ALL_PAGE_LINKS == 9 and _page_numbers(9, 0) == list(range(9))
    assert _page_numbers(50, 0) == [0, 1, 2, None, 49]
    assert _page_numbers(50, 3) == [0, 1, 2, 3, 4, 5, None, 49]
    assert _page_numbers(50, 4) == [0, 1, 2, 3, 4, 5, 6, None, 49]
    assert _page_numbers(50, 24) == [0, None, 22, 23, 24, 25, 26, None, 49]
    assert _page_numbers(50, 49) == [0, None, 47, 48, 49]
    assert _page_numbers(10, 5) == [0, None, 3, 4, 5, 6, 7, 8, 9]


def test_a_condensed_page_row_links_every_page_through_the_index(dataset, tiny_ils_tasks, tmp_path, monkeypatch):
    """With more pages than the row lists (the limit lowered for the tiny dataset's 4 pages), the row links the pages
    near this one, the first and the last, and 'all N pages' leads to the list of every page in the index."""
    import cxrground.ils.gallery as gallery

    monkeypatch.setattr(gallery, "ALL_PAGE_LINKS", 3)
    monkeypatch.setattr(gallery, "NEAR_PAGES", 0)
    result = render_gallery(dataset, _images(tiny_ils_tasks), tmp_path / "g.html", limit=10, per_page=1)
    names = [p.name for p in result.pages]
    first = (tmp_path / "g.html").read_text()
    nav = first.split("<nav class='pages'>", 1)[1].split("</nav>", 1)[0]
    assert ("<b aria-current='page'>1</b> <span class='off'>&hellip;</span> "
            "<a class='pg' href='g.p4.html'>4</a> <a class='pg' href='g.p2.html' rel='next'>next &rsaquo;</a> "
            "&middot; <a href='#pages'>all 4 pages</a>") in nav
    listed = first.split("<p class='pages' id='pages'>", 1)[1].split("</p>", 1)[0]
    assert "<details class='toc' id='index'><summary>" in first.split("<p class='pages' id='pages'>", 1)[0]
    assert listed == ("Pages: <b aria-current='page'>1</b> " + " ".join(
        f"<a class='pg' href='{name}'>{j + 2}</a>" for j, name in enumerate(names[1:])))
    third = (tmp_path / "g.p3.html").read_text()
    assert "<b aria-current='page'>3</b>" in third.split("<p class='pages' id='pages'>", 1)[1].split("</p>", 1)[0]
    assert ("<a class='pg' href='g.html'>1</a> <a class='pg' href='g.p2.html'>2</a> <b aria-current='page'>3</b> "
            "<a class='pg' href='g.p4.html'>4</a>") in third  # a gap of one page shows that page


def test_memory_holds_one_studys_html_not_every_pages(dataset, tiny_ils_tasks, tmp_path, monkeypatch):
    """The studies' HTML waits on disk for its page: with each thumbnail made 8 MB, the peak of Python's memory
    while the 4 studies' pages are written stays under 5.5 thumbnails (a study's HTML is built and kept in a few
    copies at a time); held in memory until written, the 4 studies alone were 4 thumbnails, on top of those copies."""
    import tracemalloc

    import cxrground.ils.gallery as gallery

    size = 8 << 20
    monkeypatch.setattr(gallery, "_jpeg_data_url", lambda rgb: "data:image/jpeg;base64," + "A" * size)
    images = _images(tiny_ils_tasks)
    tracemalloc.start()
    try:
        result = render_gallery(dataset, images, tmp_path / "g.html", limit=10, per_page=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(result.pages) == 4 and all(p.stat().st_size > size for p in result.pages)
    assert peak < 5.5 * size, f"peak {peak / size:.1f} thumbnails"
