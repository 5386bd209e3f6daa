"""``percept gallery``: a static page, loaded in headless Chromium, without console errors; filters work."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from cxrground.percept.gallery import render_gallery
from cxrground.percept.schema import load_benchmark
from percept_build_helpers import synthetic_bench


@pytest.fixture(scope="module")
def gallery(tmp_path_factory) -> tuple[Path, Path]:
    bench, _ = synthetic_bench(tmp_path_factory)
    out = tmp_path_factory.mktemp("gallery") / "gallery.html"
    render_gallery(bench, out)
    return bench, out


def test_gallery_is_self_contained_and_shows_answers(gallery) -> None:
    bench, out = gallery
    text = out.read_text()
    assert not re.search(r"(src|href)=['\"]https?://", text) and "http://" not in text and "https://" not in text
    b = load_benchmark(bench)
    assert all(key in text for key in b.cases)
    rr = next(c for k, c in sorted(b.cases.items()) if c.qa_path == "revision_required")
    assert rr.contour_qa is not None
    assert html.escape(rr.contour_qa.contour_eval_qa.question) in text
    assert text.count("class='case'") == len(b.cases)


def test_gallery_in_browser_filters(gallery, page) -> None:
    bench, out = gallery
    b = load_benchmark(bench)
    page.goto(out.resolve().as_uri())
    page.wait_for_load_state("load")
    assert page.console_errors == []
    assert page.locator(".case:visible").count() == len(b.cases)
    # every image link resolves to a benchmark file
    srcs = page.evaluate("Array.from(document.images).map(i => i.getAttribute('src'))")
    assert srcs and all((out.parent / s).resolve().is_file() for s in srcs)
    lesion = sorted({c.lesion for c in b.cases.values()})[0]
    page.select_option("#f-lesion", lesion)
    want = sum(1 for c in b.cases.values() if c.lesion == lesion)
    assert page.locator(".case:visible").count() == want
    assert page.locator("#count").inner_text() == str(want)
    page.select_option("#f-path", "lesion_free")
    want_lf = sum(1 for c in b.cases.values() if c.lesion == lesion and c.qa_path == "lesion_free")
    assert page.locator(".case:visible").count() == want_lf
    page.select_option("#f-lesion", "all")
    page.select_option("#f-path", "all")
    assert page.locator(".case:visible").count() == len(b.cases)
    # the right answers are highlighted
    assert page.locator("li.right").count() >= len(b.cases)
    assert page.console_errors == []


def test_gallery_never_links_a_file_outside_the_benchmark(gallery, tmp_path) -> None:
    import json
    import shutil

    bench, _ = gallery
    copy = tmp_path / "bench"
    shutil.copytree(bench, copy, ignore=shutil.ignore_patterns(".work"))
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG secret")
    data = json.loads((copy / "chexpercept.json").read_text())
    keys = sorted(data)
    data[keys[0]]["detection_qa"]["relative_path"] = str(secret)
    data[keys[1]]["detection_qa"]["relative_path"] = "../secret.png"
    (copy / "cases" / "link.png").symlink_to(secret)
    data[keys[2]]["detection_qa"]["relative_path"] = "cases/link.png"
    (copy / "chexpercept.json").write_text(json.dumps(data))
    out = copy / "gallery.html"
    render_gallery(copy, out)
    text = out.read_text()
    srcs = re.findall(r"src='([^']*)'", text)
    assert srcs and all((out.parent / html.unescape(s)).resolve().is_relative_to(copy.resolve()) for s in srcs)
    assert "secret.png" not in " ".join(srcs) and "link.png" not in " ".join(srcs)
    assert text.count("not shown") == 3


def test_embed_inlines_the_images_and_the_help_says_they_are_linked(gallery, tmp_path) -> None:
    """`percept gallery` links the images relatively (its --help says to move the page with the benchmark);
    --embed inlines each one as a base64 data URL of the benchmark file's bytes, so the page stands alone."""
    import base64

    from click.testing import CliRunner

    from cxrground.cli import main

    bench, linked = gallery
    help_text = " ".join(CliRunner().invoke(main, ["percept", "gallery", "--help"]).output.split())
    assert "relative path" in help_text and "together with the benchmark folder" in help_text and "--embed" in help_text
    out = tmp_path / "mail" / "gallery.html"
    res = CliRunner().invoke(main, ["percept", "gallery", str(bench), "--out", str(out), "--embed"])
    assert res.exit_code == 0, res.output
    assert "images embedded" in res.output
    plain = re.findall(r"src='([^']*)'", linked.read_text())
    inline = re.findall(r"src='([^']*)'", out.read_text())
    assert len(inline) == len(plain) > 0 and all(s.startswith("data:image/png;base64,") for s in inline)
    for rel, url in zip(plain, inline, strict=True):
        assert base64.b64decode(url.split(",", 1)[1]) == (linked.parent / html.unescape(rel)).read_bytes()
    res = CliRunner().invoke(main, ["percept", "gallery", str(bench), "--out", str(tmp_path / "g.html")])
    assert res.exit_code == 0 and "linked relatively" in res.output
