"""Object storage for build inputs and outputs: fsspec URLs (``s3://``, ``gs://``, ``file://``) beside local paths.

:func:`is_url` tells a URL from a local path; :class:`Store` is a folder in an fsspec file system (the ``store``
extra: fsspec, s3fs, gcsfs), addressed by paths relative to its root. Writes are atomic as each backend allows: a
local or ``file://`` folder writes a temporary file and renames it; S3 and GCS publish an object only when its
single PUT (or multipart upload) completes, so a reader sees the whole object or none. Larger outputs are written to
a local temporary file first and uploaded in one piece (:meth:`Store.put_file`). Credentials come from the usual
places of each backend (``AWS_*`` variables, ``~/.aws``, ``GOOGLE_APPLICATION_CREDENTIALS``); an S3-compatible
server is named with ``AWS_ENDPOINT_URL`` (or ``FSSPEC_S3_ENDPOINT_URL``), a GCS emulator with
``STORAGE_EMULATOR_HOST`` (then ``gs://`` goes to it anonymously, through gcsfs's JSON-API file system).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cxrground.errors import ConfigError, InputError
from cxrground.io.files import atomic_write_bytes

__all__ = ["Store", "is_url", "local_copy"]


def is_url(location: str | Path | None) -> bool:
    """True for an fsspec URL (``scheme://...``), False for a local path or None."""
    return isinstance(location, str) and "://" in location


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError as exc:
        raise ConfigError(f"{url}: object storage needs fsspec: pip install 'cxrground[store]'") from exc
    if url.startswith(("gs://", "gcs://")) and _gcs_emulator():
        return _emulated_gcs(url)
    options: dict[str, Any] = {}
    endpoint = os.environ.get("FSSPEC_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
    if url.startswith(("s3://", "s3a://")) and endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{url}: no file system for this URL ({exc}); for s3:// and gs:// install "
                          "'cxrground[store]'") from exc
    return fs, root.rstrip("/")


def _gcs_emulator() -> bool:
    """Whether ``STORAGE_EMULATOR_HOST`` names a GCS emulator."""
    return os.environ.get("STORAGE_EMULATOR_HOST", "") not in ("", "default")


@functools.lru_cache(maxsize=1)
def _backend_errors() -> tuple[type[BaseException], ...]:
    """What a backend raises for a request that failed: :class:`OSError` (s3fs, fsspec, gcsfs's 403 and lost
    connections), gcsfs's ``HttpError`` (a 401, among others) and botocore's ``BotoCoreError`` (an S3 endpoint
    that cannot be reached)."""
    errors: list[type[BaseException]] = [OSError]
    try:
        from gcsfs.retry import HttpError
    except ImportError:
        pass
    else:
        errors.append(HttpError)
    try:
        from botocore.exceptions import BotoCoreError  # an S3 endpoint that cannot be reached, among others
    except ImportError:
        pass
    else:
        errors.append(BotoCoreError)
    return tuple(errors)


_NO_GCS_CREDENTIALS = ("; no Google Cloud credentials were found, so the request went out anonymously: set "
                       "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run "
                       "'gcloud auth application-default login'")
_BAD_GCS_KEY = ("; GOOGLE_APPLICATION_CREDENTIALS names {path}, which {what}, so the request went out anonymously: "
                "point it at a service-account key file")
_NO_S3_CREDENTIALS = ("; no AWS credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or "
                      "AWS_PROFILE, or give the machine a role")
#: Where the credentials of a Ray actor come from (it does not get the driver's secrets).
_ON_RAY_WORKERS = (" (on a Ray cluster, in the environment of `ray start` on every node: the workers do not get the "
                   "driver's credentials)")


def _gcs_key_problem() -> str:
    """The hint for a ``GOOGLE_APPLICATION_CREDENTIALS`` that names no readable service-account key ("" when it is
    unset or names one)."""
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if not path:
        return ""
    try:
        key = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return _BAD_GCS_KEY.format(path=path, what="does not exist")
    except (OSError, ValueError, UnicodeDecodeError):
        return _BAD_GCS_KEY.format(path=path, what="is not a JSON key file")
    if not isinstance(key, dict) or (not key.get("private_key") and not key.get("refresh_token")):
        return _BAD_GCS_KEY.format(path=path, what="holds no private key or refresh token")
    return ""


def _in_ray_worker() -> bool:
    """Whether this process is a Ray worker (its driver's credentials do not reach it)."""
    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized()
                    and ray.get_runtime_context().worker.mode == ray.WORKER_MODE)
    except Exception:
        return False


def _emulated_gcs(url: str) -> tuple[Any, str]:
    """``url`` on the GCS emulator at ``STORAGE_EMULATOR_HOST``: anonymous (an emulator checks no credentials, and
    the usual search would probe the GCE metadata server), and gcsfs's JSON-API file system, because its default
    one asks each bucket's layout over the gRPC Storage Control API, which emulators do not serve (every call would
    wait out its 60 s retry)."""
    try:
        from gcsfs.core import GCSFileSystem
    except ImportError as exc:
        raise ConfigError(f"{url}: gs:// needs gcsfs: pip install 'cxrground[store]'") from exc
    fs = GCSFileSystem(token="anon")
    return fs, fs._strip_protocol(url).rstrip("/")


class Store:
    """A folder at a local path or an fsspec URL; paths below are relative to it, with ``/``."""

    def __init__(self, location: str | Path) -> None:
        self.location = str(location)
        self.local = not is_url(self.location) or self.location.startswith("file://")
        if self.local:
            self.root = self.location.removeprefix("file://")
            self.fs = None
        else:
            self.fs, self.root = _filesystem(self.location)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return Store, (self.location,)  # workers open their own connection

    def refresh(self) -> None:
        """Forget the listings the file system cached (s3fs keeps a folder's listing: an object written since by
        another process would read as missing)."""
        if self.fs is not None:
            self.fs.invalidate_cache()

    def path(self, rel: str) -> str:
        """The full path (local) or bucket key (remote) of ``rel``."""
        return f"{self.root}/{rel}" if rel else self.root

    def url(self, rel: str = "") -> str:
        """``rel`` as the user would name it (a local path or a URL)."""
        if self.local:
            return self.path(rel)
        return self.location.rstrip("/") + (f"/{rel}" if rel else "")

    def _failure(self, rel: str, doing: str, exc: BaseException) -> str:
        """Why ``doing`` on ``rel`` failed, in one line, with a hint when a ``gs://`` request was anonymous for
        want of credentials."""
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        anonymous = getattr(getattr(self.fs, "credentials", None), "method", None) == "anon"
        hint = ""
        if anonymous and not _gcs_emulator():
            hint = _gcs_key_problem() or _NO_GCS_CREDENTIALS
        elif "Unable to locate credentials" in reason:
            hint = _NO_S3_CREDENTIALS
        if hint and _in_ray_worker():
            hint += _ON_RAY_WORKERS
        return f"cannot be {doing} ({reason}){hint}"

    @contextmanager
    def _reading(self, rel: str) -> Iterator[None]:
        """Turn a failed request for ``rel`` into :class:`InputError` naming its URL (a missing object stays
        :class:`FileNotFoundError`)."""
        try:
            yield
        except FileNotFoundError:
            raise
        except _backend_errors() as exc:
            raise InputError(self._failure(rel, "read", exc), self.url(rel)) from exc

    @contextmanager
    def _writing(self, rel: str) -> Iterator[None]:
        """Turn a failed upload of ``rel`` into :class:`ConfigError` naming its URL."""
        try:
            yield
        except _backend_errors() as exc:
            raise ConfigError(f"{self.url(rel)}: {self._failure(rel, 'written', exc)}") from exc

    def exists(self, rel: str) -> bool:
        """Whether the file ``rel`` exists."""
        if self.local:
            return Path(self.path(rel)).is_file()
        return bool(self.fs.isfile(self.path(rel)))

    def read_bytes(self, rel: str) -> bytes:
        """The content of ``rel``; :class:`FileNotFoundError` when it does not exist."""
        if self.local:
            return Path(self.path(rel)).read_bytes()
        with self._reading(rel):
            return self.fs.cat_file(self.path(rel))

    def read_head(self, rel: str, size: int) -> bytes:
        """The first ``size`` bytes of ``rel`` (fewer when it is shorter; one ranged request on object storage, the
        rest of the object is not read); :class:`FileNotFoundError` when it does not exist."""
        if self.local:
            with Path(self.path(rel)).open("rb") as fh:
                return fh.read(size)
        with self._reading(rel):
            return self.fs.cat_file(self.path(rel), start=0, end=size)

    def read_text(self, rel: str) -> str:
        """The UTF-8 text of ``rel``."""
        return self.read_bytes(rel).decode("utf-8")

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write ``rel`` atomically (a rename locally, one PUT on object storage)."""
        if self.local:
            atomic_write_bytes(self.path(rel), data)
        else:
            with self._writing(rel):
                self.fs.pipe_file(self.path(rel), data)

    def write_text(self, rel: str, text: str) -> None:
        """Write ``rel`` as UTF-8 text, atomically."""
        self.write_bytes(rel, text.encode("utf-8"))

    def put_file(self, local: str | Path, rel: str) -> None:
        """Upload (or move, locally) the finished file ``local`` to ``rel`` in one piece."""
        if self.local:
            Path(self.path(rel)).parent.mkdir(parents=True, exist_ok=True)
            os.replace(local, self.path(rel))
        else:
            with self._writing(rel):
                self.fs.put_file(str(local), self.path(rel))

    def remove(self, rel: str) -> None:
        """Delete ``rel`` if it exists."""
        if self.local:
            Path(self.path(rel)).unlink(missing_ok=True)
        elif self.fs.exists(self.path(rel)):
            self.fs.rm_file(self.path(rel))

    def remove_tree(self, rel: str) -> None:
        """Delete the folder ``rel`` with everything under it."""
        if self.local:
            import shutil

            shutil.rmtree(self.path(rel), ignore_errors=True)
        elif self.fs.exists(self.path(rel)):
            self.fs.rm(self.path(rel), recursive=True)

    def find(self, rel: str = "") -> dict[str, int]:
        """Every file under ``rel`` with its size in bytes, keyed by its path relative to the store's root, in
        sorted order (one listing call on object storage)."""
        if self.local:
            base = Path(self.path(rel))
            return {p.relative_to(self.root).as_posix(): p.stat().st_size
                    for p in sorted(base.rglob("*")) if p.is_file()}
        prefix = self.root + "/"
        try:
            with self._reading(rel):
                found = self.fs.find(self.path(rel), detail=True)
        except FileNotFoundError as exc:  # no bucket (a missing folder lists as empty)
            raise InputError(self._failure(rel, "listed", exc), self.url(rel)) from exc
        return {k.removeprefix(prefix): int(found[k].get("size") or 0) for k in sorted(found)}


@contextmanager
def local_copy(location: str | Path) -> Iterator[Path]:
    """``location`` as a local file: the path itself, or a URL's object downloaded to a temporary folder under its
    own file name (removed afterwards). A missing object is :class:`InputError` naming the URL, and so is an
    :class:`InputError` about the copy raised in the block."""
    if not is_url(location) or str(location).startswith("file://"):
        yield Path(str(location).removeprefix("file://"))
        return
    url = str(location)
    base, _, name = url.rpartition("/")
    store = Store(base)
    try:
        data = store.read_bytes(name)
    except FileNotFoundError as exc:
        raise InputError("not found", url) from exc
    with tempfile.TemporaryDirectory(prefix="cxrground-fetch-") as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        try:
            yield path
        except InputError as exc:
            if exc.path != str(path):
                raise
            exc.path = url  # name the object, not its temporary copy
            exc.args = (f"{url}: {exc.reason}",)
            raise
