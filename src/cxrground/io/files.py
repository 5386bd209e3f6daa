"""File helpers shared by every stage: atomic writes, and content hashes for provenance and resume checks.

Atomic writes: the data goes to a temporary file ``.{name}.{pid}.tmp`` in the target's folder, which then
replaces the target with :func:`os.replace` (atomic on POSIX and Windows within one file system). A reader
therefore sees the old file or the new one, never a torn one, and a killed writer leaves at most a stray
temporary file (removed when the write fails with an exception). The pid in the name keeps concurrent
writers of the same target apart. ``fsync=True`` also flushes the file and its folder to disk before and
after the rename, so the new content survives a power loss or an OS crash; without it (the default) the
write is atomic against a crash of the process only, which is what resumable builds need, and much faster.

Hashes: :func:`sha256_file` (streamed in 1 MiB chunks), :func:`sha256_bytes`, and :func:`sha256_json`, the
digest of a value's canonical JSON (``json.dumps(value, sort_keys=True)``) used for settings hashes.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError, InputError

__all__ = [
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "cut_torn_tail",
    "decode_text",
    "finite_json",
    "link_problem",
    "model_paths",
    "read_csv_text",
    "read_model_sidecar",
    "read_progress",
    "remove_stale_temp_dirs",
    "remove_stale_temps",
    "sha256_bytes",
    "sha256_file",
    "sha256_json",
    "temp_path",
    "walk_files",
]


def temp_path(path: str | Path) -> Path:
    """The temporary sibling ``.{name}.{pid}.tmp`` that an atomic write of ``path`` goes through."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_path(path: str | Path, *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path for a writer that takes a path; on success it replaces ``path``.

    For writers that stream to a path themselves (``torch.save``, ``safetensors.save_file``). The folder is
    created. When the block raises, the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        if fsync:
            _fsync(tmp)
        _usual_mode(tmp, path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(path.parent)


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The process's umask, read once (reading it means setting it, which is not safe once threads run).
_UMASK: Final[int] = _process_umask()


def _usual_mode(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the permissions ``path`` has, or those of a file created plainly (0666 less the umask): some
    writers (safetensors) create their file readable by its owner only."""
    try:
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_UMASK
        os.chmod(tmp, mode)
    except OSError:  # a file system without permissions: nothing to repair
        pass


def atomic_write_bytes(path: str | Path, data: bytes, *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring); returns ``path``."""
    path = Path(path)
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)
    return path


def atomic_write_text(path: str | Path, text: str, *, encoding: str = "utf-8", fsync: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically, encoded as ``encoding`` with no newline translation."""
    return atomic_write_bytes(path, text.encode(encoding), fsync=fsync)


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Delete the temporary files ``.{name}.{pid}.tmp`` under ``folder`` (recursively) that a killed writer left:
    those whose pid is not a running process. Returns the removed paths (a rerun calls this before writing)."""
    removed: list[Path] = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for tmp in folder.rglob(".*.tmp"):
        if not _gone(tmp.name[:-4].rsplit(".", 1)[-1]):
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def remove_stale_temp_dirs(folder: str | Path, prefix: str) -> list[Path]:
    """Delete the working folders ``{prefix}{pid}`` directly in ``folder`` whose pid is not a running process (a
    killed writer's, e.g. ``.assemble.{pid}``). Returns the removed paths."""
    import shutil

    removed: list[Path] = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for path in folder.glob(f"{prefix}*"):
        if not path.is_dir() or not _gone(path.name[len(prefix):]):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _gone(pid: str) -> bool:
    """``pid`` (text from a file name) names a process that is neither this one nor running: its files are stale."""
    return pid.isascii() and pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid))


def cut_torn_tail(path: str | Path) -> bytes:
    """The content of the append-only file ``path`` up to its last newline; a last line without its newline (a write
    cut short by a kill) is cut off the file too, so appends start on a fresh line."""
    path = Path(path)
    data = path.read_bytes()
    keep = data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        path.write_bytes(keep)
    return keep


def read_progress(path: str | Path, key: str = "image") -> dict[str, dict[str, Any]]:
    """The records of an append-only JSON-lines progress file by their ``key`` field (a later line wins; a torn
    last line is cut off the file, :func:`cut_torn_tail`; lines that are no JSON object with a text ``key`` are
    skipped); empty when the file does not exist."""
    path = Path(path)
    if not path.is_file():
        return {}
    done: dict[str, dict[str, Any]] = {}
    for line in cut_torn_tail(path).decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get(key), str):
            done[rec[key]] = rec
    return done


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists (another user's) or cannot tell: leave its file alone
    return True


#: Byte-order marks of the Unicode encodings other than UTF-8 that a text file is read in (Windows' "Unicode" text
#: export is UTF-16 with a BOM), UTF-32 first (its little-endian BOM starts like UTF-16's).
_UNICODE_BOMS: Final[tuple[tuple[bytes, str], ...]] = (
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def decode_text(data: bytes) -> str:
    """The text of a file's bytes: UTF-8 (a byte-order mark dropped), or UTF-16 / UTF-32 when it starts with that
    encoding's byte-order mark; a :class:`UnicodeDecodeError` when the bytes are not that."""
    for bom, codec in _UNICODE_BOMS:
        if data.startswith(bom):
            return data.decode(codec)  # the codec reads the BOM for the byte order, and drops it
    return data.decode("utf-8-sig")


def read_csv_text(path: str | Path, what: str = "table") -> str:
    """The text of a CSV file, plain or gzipped (as MIMIC-CXR ships its tables), without a byte-order mark (UTF-8, or
    UTF-16 with its mark: :func:`decode_text`); an :class:`~cxrground.errors.InputError` naming the file when it
    cannot be read or is not such text."""
    import gzip

    from cxrground.errors import InputError

    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{what} cannot be read ({exc.strerror or exc})", path) from exc
    try:
        return decode_text(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} is not a UTF-8 CSV (or UTF-16 with its byte-order mark), plain or gzipped "
                         f"({exc})", path) from exc


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_json(value: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """Hex sha256 of ``value``'s canonical JSON (sorted keys, ASCII, ``json``'s default separators).

    ``default``: as in :func:`json.dumps`, for values JSON cannot encode (None: they raise ``TypeError``).
    """
    return sha256_bytes(json.dumps(value, sort_keys=True, default=default).encode("utf-8"))


def _fsync(path: Path) -> None:
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    if os.name != "posix":  # folders cannot be opened for fsync on Windows
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def model_paths(path: str | Path) -> tuple[Path, Path]:
    """The two files of a model, ``NAME.safetensors`` and its sidecar ``NAME.json``, from either or the stem ``NAME``
    (only those two suffixes are taken off: ``pose.v2.safetensors`` is ``pose.v2``, and ``pose.failures.jsonl`` names
    ``pose.failures.jsonl.safetensors``, which is no model of it)."""
    text = str(path)
    for suffix in (".safetensors", ".json"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    return Path(text + ".safetensors"), Path(text + ".json")


def read_model_sidecar(path: str | Path, fmt: str, what: str = "model") -> dict[str, Any]:
    """The JSON sidecar of a model (``path`` names either file or the stem), checked to be a JSON object of format
    ``fmt``; else a :class:`~cxrground.errors.ConfigError` naming the file and the ``what``."""
    json_path = model_paths(path)[1]
    if not json_path.is_file():
        raise ConfigError(f"{what} sidecar {json_path} not found (a .safetensors needs its .json next to it)")
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} sidecar {json_path} is not valid JSON ({exc})") from exc
    got = data.get("format") if isinstance(data, dict) else type(data).__name__
    if got != fmt:
        raise ConfigError(f"{what} sidecar {json_path} has format {got!r}, expected {fmt!r}")
    return data


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; a file that cannot be read, is no JSON or holds another value is an
    :class:`~cxrground.errors.InputError` naming it as ``what`` (e.g. ``"settings of a prepared dataset"``)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"unreadable {what} ({exc})", path) from exc
    if not isinstance(data, dict):
        raise InputError(f"unreadable {what} (not a JSON object)", path)
    return data


def finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float (nested in objects and lists) as None: JSON that strict parsers
    read (``json.dumps`` would write ``NaN``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def flat_json(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` of a nested JSON object (a leaf that is no object keeps its own value)."""
    if not isinstance(value, Mapping):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, sub in value.items():
        out.update(flat_json(sub, f"{prefix}.{key}" if prefix else str(key)))
    return out


def link_problem(path: str | Path) -> str | None:
    """Why the symbolic link ``path`` reaches no file: a loop (it leads back to itself, directly or through other
    links), or a target that does not exist; None for anything else (a file, a folder, a good link, a missing path
    that is no link)."""
    import errno

    path = Path(path)
    try:
        path.stat()
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop (the link never reaches a file)"
        if path.is_symlink():
            return f"symbolic link whose target does not exist ({os.readlink(path)})"
        return None


def walk_files(folder: Path, folders: bool = False) -> list[Path]:
    """Every file under ``folder`` (and every link that is not a folder, broken ones included), sorted, following
    links to folders once each (a link back into a folder already walked is not entered again); with ``folders``
    the folders below ``folder`` too."""
    seen: set[str] = set()
    out: list[Path] = []
    for top, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        out += [Path(top) / name for name in files]
        if folders:
            out += [Path(top) / name for name in dirs]
    return sorted(out)
