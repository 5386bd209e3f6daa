"""Open-i / Indiana University chest X-ray reports (``<eCitation>`` XML).

Read: ``uId/@id`` (report id, e.g. ``CXR1018``), the ``AbstractText`` sections labelled COMPARISON,
INDICATION, FINDINGS, IMPRESSION (lower-cased; an empty element counts as absent; repeated labels
are joined with a blank line), the MeSH ``major``/``minor`` terms verbatim, the ``parentImage`` ids,
and ``pmcId``/``IUXRId``/``articleDate`` as metadata.
"""

from __future__ import annotations

import codecs
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from cxrground.errors import ReportError
from cxrground.io.files import decode_text
from cxrground.reports.model import Report

__all__ = ["decode_utf8", "parse_iu_xml", "read_iu_xml"]

_ENCODING_DECL = re.compile(rb"^\s*<\?xml[^>]*encoding\s*=\s*[\"']([A-Za-z0-9._-]+)[\"']")
#: The encoding a declaration states (``encoding="UTF-16"``), to say UTF-8 once the text is re-encoded.
_UTF16_DECL = re.compile(rb"^(\s*<\?xml[^>]*encoding\s*=\s*[\"'])[A-Za-z0-9._-]+([\"'])")


def decode_utf8(data: bytes, path: str | Path | None = None) -> str:
    """Return ``data`` decoded as UTF-8 (a BOM is dropped), or as UTF-16 / UTF-32 when it starts with that
    encoding's byte-order mark (:func:`~cxrground.io.files.decode_text`); ``ReportError`` names the first bad byte
    and its offset."""
    try:
        return decode_text(data)
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise ReportError(f"not valid {exc.encoding.upper().replace('-SIG', '')}: byte 0x{bad} at offset "
                          f"{exc.start} ({exc.reason}); reports are UTF-8 text (or UTF-16 with its byte-order mark)",
                          path) from None


def _text(element: ET.Element | None) -> str:
    return "".join(element.itertext()).strip() if element is not None else ""


def parse_iu_xml(data: bytes | str, source: str | Path | None = None) -> Report:
    """Return the :class:`Report` of one IU XML document; ``ReportError`` when it is empty, undecodable or malformed."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if not raw:
        raise ReportError("empty file", source)
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # UTF-16: made UTF-8, its declaration too
        raw = _UTF16_DECL.sub(b"\\1utf-8\\2", decode_utf8(raw, source).encode("utf-8"), count=1)
    if not raw.strip():
        raise ReportError("whitespace-only file", source)
    declared = _ENCODING_DECL.match(raw.lstrip(b"\xef\xbb\xbf"))
    if declared is None or declared.group(1).lower().replace(b"_", b"-") in {b"utf-8", b"utf8"}:
        decode_utf8(raw, source)
    if b"<!ENTITY" in raw:
        raise ReportError("XML entity declarations are not accepted", source)
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as exc:
        raise ReportError(f"malformed XML: {exc}", source) from None
    if root.tag != "eCitation":
        raise ReportError(f"not an Open-i/IU report: root element is <{root.tag}>, expected <eCitation>", source)

    uid = root.find("uId")
    report_id = (uid.get("id") or "").strip() if uid is not None else ""
    if not report_id:
        iuxr = root.find("IUXRId")
        if iuxr is not None and iuxr.get("id"):
            report_id = f"CXR{iuxr.get('id')}"
        elif source is not None:
            report_id = Path(source).stem
        else:
            raise ReportError("IU report has no uId (report id)", source)

    sections: dict[str, str] = {}
    for element in root.iter("AbstractText"):
        label = (element.get("Label") or "").strip().lower()
        text = _text(element)
        if not label or not text:
            continue
        sections[label] = f"{sections[label]}\n\n{text}" if label in sections else text

    mesh = root.find("MeSH")
    major = tuple(t for t in (_text(e) for e in mesh.iter("major")) if t) if mesh is not None else ()
    minor = tuple(t for t in (_text(e) for e in mesh.iter("minor")) if t) if mesh is not None else ()
    image_ids = tuple(e.get("id", "").strip() for e in root.iter("parentImage") if e.get("id", "").strip())

    metadata: dict[str, str] = {}
    for key, tag in (("pmc_id", "pmcId"), ("iuxr_id", "IUXRId")):
        element = root.find(tag)
        if element is not None and element.get("id"):
            metadata[key] = element.get("id", "")
    date = _text(root.find("articleDate"))
    if date:
        metadata["article_date"] = date

    return Report(
        report_id=report_id,
        format="iu_xml",
        sections=sections,
        source=str(source) if source is not None else None,
        mesh_major=major,
        mesh_minor=minor,
        image_ids=image_ids,
        metadata=metadata,
    )


def read_iu_xml(path: str | Path) -> Report:
    """Return the :class:`Report` of the IU XML file at ``path``; ``ReportError`` for a missing or bad file."""
    path = Path(path)
    if not path.exists():
        raise ReportError("file does not exist", path)
    if not path.is_file():
        raise ReportError("not a regular file", path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReportError(f"cannot read file: {exc.strerror or exc}", path) from None
    return parse_iu_xml(data, source=path)
