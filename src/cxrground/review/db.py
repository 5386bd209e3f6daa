"""The review database: one SQLite file in WAL mode holding users, review items, assignments and decisions.

* **Durability**: every write is its own transaction committed (``synchronous=FULL``) before the function
  returns, so a server killed after answering keeps every acknowledged decision. One connection per call
  (:meth:`ReviewDB.connect`): connections are never shared between threads; concurrent writers wait on
  SQLite's lock (``busy_timeout``).
* **Users and tokens**: a token is ``rv<user id>_<secret>`` (the secret: 32 random bytes, URL-safe); only a
  salted SHA-256 of the secret is stored and compared with :func:`hmac.compare_digest` (a 256-bit random
  secret needs no key stretching, and a cheap check keeps a flood of wrong tokens from costing CPU). Users
  created with the older salted PBKDF2-SHA256 hash are checked with it once and re-hashed on success.
  Sessions (browser login) are random tokens stored as their SHA-256 (they are 256-bit random, so a fast
  hash is enough), with a per-session CSRF token.
* **Items**: ``kind`` ``ils`` (one MIMIC-ILS pair, one decision part :data:`ILS_PART`) or ``bench`` (one
  CheXpercept case; one decision part per question, named as the §1.4 task rows of
  :data:`cxrground.percept.cases.TASKS`). ``key`` is the CheXpercept ``key_id`` ``{lesion}_{pair_id}``, the key
  ``percept build --review`` reads; an item is identified by ``(kind, key)``, so a benchmark case and the ILS
  pair it was built from are two items (older databases keyed by ``key`` alone are migrated when opened).
  Image files are stored as absolute paths at import time and served by item id and index: nothing a request
  carries ever becomes a path.
* **Decisions**: ``accept``, ``reject`` (with a reason from :data:`REJECT_REASONS`) or, for a positive ILS pair,
  ``correct`` with the reviewer's mask (COCO RLE at the image's native size); any of them may carry the reviewer's
  free-text ``comment`` (empty when none; decisions made before comments were kept have an empty one).
  ``decisions`` holds the latest decision per assignment and part, with a ``version`` that every write of that part
  raises by one. A write may name the version it was made over (``expected_version``, 0: undecided): when another
  write came first it is refused (:class:`DecisionConflict`, carrying what is stored now) unless it says
  ``overwrite``. Every write is also appended to ``decision_history`` (who, when, what, its comment, the version it
  made and the one it replaced), in the same transaction, so a replaced decision (and its mask) can be read back
  (:meth:`ReviewDB.history`). The comment alone can be changed (:meth:`ReviewDB.write_comment`: same version rules,
  a history row flagged as a comment edit). Removing an assignment (:meth:`ReviewDB.unassign`) removes its current
  decisions; its history rows stay (they name the item and reviewer themselves), marked removed.
* **Views**: each item keeps its film's view (``PA``, ``AP``, ``LATERAL``, ...) when the import could tell it, else
  NULL (unknown; items of databases made before views were kept, until the same input is imported again).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError, InputError

__all__ = [
    "DECISIONS",
    "ILS_PART",
    "KINDS",
    "MAX_SESSION_HOURS",
    "REJECT_REASONS",
    "REVIEW_TABLES",
    "ROLES",
    "SESSION_SECONDS",
    "UNREADABLE_REASON",
    "Assignment",
    "DecisionConflict",
    "Item",
    "Neighbours",
    "QueueRow",
    "ReviewDB",
    "Snapshot",
    "StoredDecision",
    "User",
]

ROLES: Final[tuple[str, str]] = ("reviewer", "admin")
KINDS: Final[tuple[str, str]] = ("ils", "bench")
DECISIONS: Final[tuple[str, str, str]] = ("accept", "reject", "correct")
#: The single decision part of an ILS pair.
ILS_PART: Final[str] = "pair"
#: The short lists of rejection reasons offered by the pages, per item kind.
REJECT_REASONS: Final[dict[str, tuple[str, ...]]] = {
    "ils": ("wrong lesion", "wrong location", "mask inaccurate", "not supported by the report",
            "image unreadable", "other"),
    "bench": ("wrong answer key", "ambiguous question", "image unclear", "overlay or points wrong", "other"),
}
#: The rejection reason of each item kind for a film the server cannot show: the only decision left for such an item.
UNREADABLE_REASON: Final[dict[str, str]] = {"ils": "image unreadable", "bench": "image unclear"}
#: How long a sign-in lasts unless ``review serve --session-hours`` says otherwise, and the longest it may say.
SESSION_SECONDS: Final[int] = 12 * 3600
MAX_SESSION_HOURS: Final[int] = 720
_PBKDF2_ITERATIONS: Final[int] = 120_000
_USER_CACHE_SECONDS: Final[float] = 5.0
#: The columns of ``decision_history``: ``item_id`` and ``user_id`` name what was decided and by whom, so a row outlives
#: its assignment (``review unassign --force``: ``assignment_id`` becomes NULL, ``removed`` says when); ``edit`` is
#: ``comment`` for a write that changed only the comment, else empty.
_HISTORY_COLUMNS: Final[str] = """
  id INTEGER PRIMARY KEY, assignment_id INTEGER, item_id INTEGER NOT NULL REFERENCES items(id), part TEXT NOT NULL,
  user_id INTEGER NOT NULL REFERENCES users(id), decision TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', mask TEXT,
  at REAL NOT NULL, version INTEGER NOT NULL, replaced_version INTEGER, overwrite INTEGER NOT NULL DEFAULT 0,
  via TEXT NOT NULL DEFAULT '', comment TEXT NOT NULL DEFAULT '', edit TEXT NOT NULL DEFAULT '', removed REAL);"""
_SCHEMA: Final[str] = f"""
CREATE TABLE IF NOT EXISTS users(
  id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, role TEXT NOT NULL CHECK(role IN ('reviewer', 'admin')),
  salt BLOB NOT NULL, token_hash BLOB NOT NULL, created REAL NOT NULL, hash_kind TEXT NOT NULL DEFAULT 'pbkdf2');
CREATE TABLE IF NOT EXISTS sessions(
  id_hash TEXT PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id), csrf TEXT NOT NULL,
  expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS items(
  id INTEGER PRIMARY KEY, kind TEXT NOT NULL CHECK(kind IN ('ils', 'bench')), key TEXT NOT NULL,
  lesion TEXT NOT NULL, item_type TEXT NOT NULL, positive INTEGER NOT NULL, source TEXT NOT NULL,
  height INTEGER NOT NULL, width INTEGER NOT NULL, images TEXT NOT NULL, payload TEXT NOT NULL, mask TEXT,
  view TEXT, UNIQUE(kind, key));
CREATE TABLE IF NOT EXISTS assignments(
  id INTEGER PRIMARY KEY, item_id INTEGER NOT NULL REFERENCES items(id),
  user_id INTEGER NOT NULL REFERENCES users(id), position INTEGER NOT NULL, UNIQUE(item_id, user_id));
CREATE TABLE IF NOT EXISTS decisions(
  id INTEGER PRIMARY KEY, assignment_id INTEGER NOT NULL REFERENCES assignments(id), part TEXT NOT NULL,
  decision TEXT NOT NULL CHECK(decision IN ('accept', 'reject', 'correct')), reason TEXT NOT NULL DEFAULT '',
  mask TEXT, updated REAL NOT NULL, version INTEGER NOT NULL DEFAULT 1, comment TEXT NOT NULL DEFAULT '',
  UNIQUE(assignment_id, part));
CREATE TABLE IF NOT EXISTS decision_history({_HISTORY_COLUMNS}
CREATE INDEX IF NOT EXISTS assignments_user ON assignments(user_id, position);
CREATE INDEX IF NOT EXISTS decision_history_assignment ON decision_history(assignment_id, part, version);
"""
#: The items table with ``UNIQUE(kind, key)`` (databases made before keyed ``key`` alone are rebuilt to it).
_ITEMS_MIGRATION: Final[str] = """
CREATE TABLE items_by_kind(
  id INTEGER PRIMARY KEY, kind TEXT NOT NULL CHECK(kind IN ('ils', 'bench')), key TEXT NOT NULL,
  lesion TEXT NOT NULL, item_type TEXT NOT NULL, positive INTEGER NOT NULL, source TEXT NOT NULL,
  height INTEGER NOT NULL, width INTEGER NOT NULL, images TEXT NOT NULL, payload TEXT NOT NULL, mask TEXT,
  UNIQUE(kind, key));
INSERT INTO items_by_kind SELECT id, kind, key, lesion, item_type, positive, source, height, width, images, payload,
  mask FROM items;
DROP TABLE items;
ALTER TABLE items_by_kind RENAME TO items;
"""
#: ``decision_history`` with ``item_id`` (filled from the assignments) and no reference to ``assignments`` (databases
#: made before an assignment could be removed are rebuilt to it).
_HISTORY_MIGRATION: Final[str] = f"""
CREATE TABLE history_by_item({_HISTORY_COLUMNS}
INSERT INTO history_by_item(id, assignment_id, item_id, part, user_id, decision, reason, mask, at, version,
  replaced_version, overwrite, via, comment) SELECT h.id, h.assignment_id, a.item_id, h.part, h.user_id, h.decision,
  h.reason, h.mask, h.at, h.version, h.replaced_version, h.overwrite, h.via, h.comment FROM decision_history h
  JOIN assignments a ON a.id = h.assignment_id;
DROP TABLE decision_history;
ALTER TABLE history_by_item RENAME TO decision_history;
CREATE INDEX IF NOT EXISTS decision_history_assignment ON decision_history(assignment_id, part, version);
"""


@dataclass(frozen=True)
class User:
    """A reviewer or an admin."""

    id: int
    name: str
    role: str

    @property
    def is_admin(self) -> bool:
        """True for the ``admin`` role."""
        return self.role == "admin"


@dataclass(frozen=True)
class Item:
    """One thing to review: an ILS pair or a CheXpercept case."""

    id: int
    kind: str
    key: str
    lesion: str
    item_type: str
    positive: bool
    source: str
    height: int
    width: int
    images: list[dict[str, str]]
    """``[{"path": absolute path, "role": "cxr" | "png", "label": ...}]``; served by index."""
    payload: dict[str, Any]
    mask: dict[str, Any] | None
    """The generated mask (COCO RLE, native size), ILS positives only."""
    view: str | None = None
    """The film's view as recorded at import (``PA``, ``AP``, ``LATERAL``, ...; upper case), None when unknown."""

    @property
    def parts(self) -> list[str]:
        """The decision parts of this item."""
        return list(self.payload.get("parts") or [ILS_PART])


@dataclass(frozen=True)
class Assignment:
    """One item in one reviewer's queue, with that reviewer's decisions ``{part: row}``."""

    id: int
    item: Item
    user_id: int
    user_name: str
    position: int
    decisions: dict[str, dict[str, Any]]

    @property
    def done(self) -> bool:
        """True when every part of the item has a decision."""
        return all(p in self.decisions for p in self.item.parts)


@dataclass(frozen=True)
class QueueRow:
    """One assignment as a queue lists it: the item's labels and which parts are decided (no payload, no masks)."""

    id: int
    key: str
    kind: str
    lesion: str
    item_type: str
    user_name: str
    position: int
    parts: list[str]
    decided: list[str]

    @property
    def done(self) -> bool:
        """True when every part of the item has a decision."""
        return set(self.parts) <= set(self.decided)


@dataclass(frozen=True)
class Snapshot:
    """Every item and every assignment (with its decisions) as one read transaction saw them."""

    items: list[Item]
    assignments: list[Assignment]


@dataclass(frozen=True)
class Neighbours:
    """Where an assignment stands in its reviewer's queue."""

    index: int
    """Its 0-based place in the queue."""
    total: int
    prev: int | None
    """The assignment before it, or None for the first."""
    next_open: int | None
    """The first open assignment after it, wrapping around (itself excluded), or None."""


@dataclass(frozen=True)
class StoredDecision:
    """A decision as one write stored it."""

    id: int
    """The row id in ``decisions`` (one row per assignment and part)."""
    version: int
    """1 for the part's first decision, one more for every later write."""
    updated: float
    """When it was written (seconds since the epoch)."""


class DecisionConflict(Exception):
    """A decision written over one it did not expect (another tab or session decided the part meanwhile);
    ``stored`` is the part's decision now: ``{decision, reason, updated, version, mask}``."""

    def __init__(self, stored: dict[str, Any], expected: int) -> None:
        super().__init__(f"the part is at version {stored['version']}, the write expected version {expected}")
        self.stored, self.expected = stored, expected


def _hash_secret(secret: str, salt: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", secret.encode("utf-8"), salt, _PBKDF2_ITERATIONS)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _fast_hash(secret: str, salt: bytes) -> bytes:
    return hashlib.sha256(salt + secret.encode("utf-8")).digest()


def _migrate(con: sqlite3.Connection) -> None:
    """Bring a database made by an older version to the current schema (idempotent; one transaction each)."""
    columns = {r[1] for r in con.execute("PRAGMA table_info(users)")}
    if "hash_kind" not in columns:
        con.execute("ALTER TABLE users ADD COLUMN hash_kind TEXT NOT NULL DEFAULT 'pbkdf2'")
    if "version" not in {r[1] for r in con.execute("PRAGMA table_info(decisions)")}:
        con.execute("ALTER TABLE decisions ADD COLUMN version INTEGER NOT NULL DEFAULT 1")
    for table in ("decisions", "decision_history"):  # the reviewer's comment: empty on decisions made before it
        if "comment" not in {r[1] for r in con.execute(f"PRAGMA table_info({table})")}:
            con.execute(f"ALTER TABLE {table} ADD COLUMN comment TEXT NOT NULL DEFAULT ''")
    if "item_id" not in {r[1] for r in con.execute("PRAGMA table_info(decision_history)")}:
        _rebuild(con, _HISTORY_MIGRATION)
    # decisions made before the history was kept: each one is its part's first history row (every later write adds
    # one in the same transaction, so a history is empty while decisions exist only in such a database)
    if (con.execute("SELECT 1 FROM decisions LIMIT 1").fetchone()
            and not con.execute("SELECT 1 FROM decision_history LIMIT 1").fetchone()):
        con.execute("INSERT INTO decision_history(assignment_id, item_id, part, user_id, decision, reason, mask, at, "
                    "version, via, comment) SELECT d.assignment_id, a.item_id, d.part, a.user_id, d.decision, "
                    "d.reason, d.mask, d.updated, d.version, 'before history', d.comment FROM decisions d "
                    "JOIN assignments a ON a.id = d.assignment_id")
    key_only = False
    for index in con.execute("PRAGMA index_list(items)").fetchall():
        if index[2]:  # unique
            cols = [r[2] for r in con.execute(f"PRAGMA index_info('{index[1]}')")]
            key_only = key_only or cols == ["key"]
    if key_only:
        _rebuild(con, _ITEMS_MIGRATION)
    if "view" not in {r[1] for r in con.execute("PRAGMA table_info(items)")}:  # items imported before: unknown view
        con.execute("ALTER TABLE items ADD COLUMN view TEXT")


def _rebuild(con: sqlite3.Connection, script: str) -> None:
    """Run a table rebuild ``script`` (statements separated by ``;``) in one transaction, references unchecked."""
    con.execute("PRAGMA foreign_keys=OFF")
    con.execute("BEGIN IMMEDIATE")
    try:
        for statement in script.split(";"):
            if statement.strip():
                con.execute(statement)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _stored(now: sqlite3.Row | None) -> dict[str, Any]:
    """What a part stores now (a :class:`DecisionConflict`'s ``stored``) from its ``decisions`` row or None."""
    if now is None:
        return {"decision": None, "reason": "", "updated": None, "version": 0, "comment": "", "mask": None}
    return {"decision": now["decision"], "reason": now["reason"], "updated": now["updated"],
            "version": int(now["version"]), "comment": now["comment"],
            "mask": json.loads(now["mask"]) if now["mask"] else None}


def _item(row: sqlite3.Row) -> Item:
    return Item(id=row["id"], kind=row["kind"], key=row["key"], lesion=row["lesion"], item_type=row["item_type"],
                positive=bool(row["positive"]), source=row["source"], height=row["height"], width=row["width"],
                images=json.loads(row["images"]), payload=json.loads(row["payload"]),
                mask=json.loads(row["mask"]) if row["mask"] else None, view=row["view"] or None)


def _items(con: sqlite3.Connection) -> list[Item]:
    return [_item(r) for r in con.execute("SELECT * FROM items ORDER BY id").fetchall()]


def _assignments(con: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> list[Assignment]:
    """The assignments matching ``where`` (over ``a``, ``i``), queue order, with their decisions."""
    rows = con.execute("SELECT a.id AS aid, a.user_id, a.position, u.name AS uname, i.* FROM assignments a "
                       "JOIN items i ON i.id = a.item_id JOIN users u ON u.id = a.user_id "
                       f"WHERE {where} ORDER BY a.user_id, a.position", args).fetchall()
    decided: dict[int, dict[str, dict[str, Any]]] = {r["aid"]: {} for r in rows}
    for d in con.execute("SELECT d.assignment_id, d.part, d.decision, d.reason, d.mask, d.updated, d.version, "
                         "d.comment "
                         "FROM decisions d JOIN assignments a ON a.id = d.assignment_id "
                         f"JOIN items i ON i.id = a.item_id WHERE {where}", args):
        if d["assignment_id"] in decided:
            decided[d["assignment_id"]][d["part"]] = {
                "decision": d["decision"], "reason": d["reason"], "updated": d["updated"], "version": d["version"],
                "comment": d["comment"], "mask": json.loads(d["mask"]) if d["mask"] else None}
    return [Assignment(r["aid"], _item(r), r["user_id"], r["uname"], r["position"], decided[r["aid"]])
            for r in rows]


#: The open assignments of one user (``?``): fewer decisions than the item has parts (an ILS pair has one part).
_OPEN_SQL: Final[str] = (
    "SELECT a.id FROM assignments a JOIN items i ON i.id = a.item_id WHERE a.user_id = ? AND "
    "(SELECT COUNT(*) FROM decisions d WHERE d.assignment_id = a.id) < CASE WHEN i.kind = 'ils' THEN 1 ELSE "
    "COALESCE(NULLIF(json_array_length(i.payload, '$.parts'), 0), 1) END")

#: Tables every review database has had since its first version (an opened file without them is not one).
REVIEW_TABLES: Final[tuple[str, ...]] = ("users", "items")


class ReviewDB:
    """The review database at ``path`` (created with :meth:`create`, opened with the constructor)."""

    def __init__(self, path: str | Path, *, must_exist: bool = True) -> None:
        self.path = Path(path)
        self._token_rows: dict[int, dict[str, Any]] = {}
        self._token_rows_until = self._token_rows_read = 0.0
        if must_exist and not self.path.is_file():
            raise InputError("review database not found (create it with `cxrground review add-user`)", self.path)
        try:
            con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the review database ({exc})", self.path) from exc
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not set(REVIEW_TABLES) <= tables and (must_exist or tables):
                # another SQLite file (a response cache), or, when it must exist, an empty one
                raise InputError("not a review database (it has no review tables; create one with `cxrground "
                                 "review add-user`)", self.path)
            mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ConfigError(f"{self.path}: SQLite refused WAL mode (got {mode})")
            con.executescript(_SCHEMA)
            _migrate(con)
        except sqlite3.DatabaseError as exc:
            raise InputError(f"not a review database ({exc})", self.path) from exc
        finally:
            con.close()

    @classmethod
    def create(cls, path: str | Path) -> ReviewDB:
        """Open ``path``, creating the file and its schema when it is missing, empty (0 bytes) or an SQLite file
        without tables; an SQLite file with other tables (not a review database) is an :class:`InputError`."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return cls(path, must_exist=False)

    @contextmanager
    def connect(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """A fresh connection; the block is one transaction, committed (durably) on success. ``write=False``:
        a read transaction (WAL readers wait for no writer and hold no write lock)."""
        con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        con.row_factory = sqlite3.Row
        try:
            con.execute("PRAGMA busy_timeout=30000")
            con.execute("PRAGMA synchronous=FULL")
            con.execute("PRAGMA foreign_keys=ON")
            con.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            raise InputError(f"review database error ({exc})", self.path) from exc
        finally:
            con.close()

    # --- users, tokens, sessions ------------------------------------------------------------------

    def add_user(self, name: str, role: str = "reviewer") -> tuple[User, str]:
        """Create a user; returns it and its token (shown once, only its hash is stored)."""
        name = name.strip()
        if not name or len(name) > 64 or not all(c.isalnum() or c in "._-" for c in name):
            raise ConfigError(f"user name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
        if role not in ROLES:
            raise ConfigError(f"role {role!r} is not one of {', '.join(ROLES)}")
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        with self.connect() as con:
            if con.execute("SELECT 1 FROM users WHERE name = ?", (name,)).fetchone():
                raise ConfigError(f"user {name!r} already exists in {self.path}")
            cur = con.execute("INSERT INTO users(name, role, salt, token_hash, created, hash_kind) "
                              "VALUES (?, ?, ?, ?, ?, 'sha256')", (name, role, salt, _fast_hash(secret, salt),
                                                                   time.time()))
            user = User(int(cur.lastrowid or 0), name, role)
        return user, f"rv{user.id}_{secret}"

    def users(self) -> list[User]:
        """Every user, by id."""
        with self.connect(write=False) as con:
            rows = con.execute("SELECT id, name, role FROM users ORDER BY id").fetchall()
        return [User(r["id"], r["name"], r["role"]) for r in rows]

    def user_by_token(self, token: str) -> User | None:
        """The user holding ``token``, or None (malformed, unknown or wrong)."""
        head, sep, secret = token.partition("_")
        digits = head[2:]
        if (len(token) > 200 or not sep or not head.startswith("rv") or not secret or not digits.isascii()
                or not digits.isdigit() or len(digits) > 18):
            return None
        row = self._token_row(int(digits))
        if row is None:
            return None
        if row["hash_kind"] == "sha256":
            if not hmac.compare_digest(_fast_hash(secret, row["salt"]), row["token_hash"]):
                return None
        else:
            if not hmac.compare_digest(_hash_secret(secret, row["salt"]), row["token_hash"]):
                return None
            with self.connect() as con:  # re-hash with the cheap check once the slow one passed
                con.execute("UPDATE users SET token_hash = ?, hash_kind = 'sha256' WHERE id = ? AND hash_kind = ?",
                            (_fast_hash(secret, row["salt"]), row["id"], row["hash_kind"]))
            self._token_rows_until = 0.0  # read the table again on the next check
        return User(row["id"], row["name"], row["role"])

    def _token_row(self, user_id: int) -> dict[str, Any] | None:
        """The id, name, role and token hash of a user, from a copy of the users table kept in memory for
        :data:`_USER_CACHE_SECONDS` (re-read early, at most once a second, for an id it does not hold), so
        checking a token opens no database connection."""
        now = time.monotonic()
        stale = now > self._token_rows_until
        if stale or (user_id not in self._token_rows and now > self._token_rows_read + 1.0):
            with self.connect(write=False) as con:
                rows = con.execute("SELECT id, name, role, salt, token_hash, hash_kind FROM users").fetchall()
            self._token_rows = {r["id"]: dict(r) for r in rows}
            self._token_rows_read, self._token_rows_until = now, now + _USER_CACHE_SECONDS
        return self._token_rows.get(user_id)

    def login(self, name: str, token: str, seconds: float = SESSION_SECONDS) -> tuple[str, str] | None:
        """Check ``name`` + ``token``; a new session ``(session token, csrf token)`` that lasts ``seconds``, or
        None."""
        user = self.user_by_token(token)
        if user is None or not hmac.compare_digest(user.name.encode(), name.strip().encode()):
            return None
        session, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self.connect() as con:
            con.execute("DELETE FROM sessions WHERE expires < ?", (time.time(),))
            con.execute("INSERT INTO sessions(id_hash, user_id, csrf, expires) VALUES (?, ?, ?, ?)",
                        (_sha256(session), user.id, csrf, time.time() + seconds))
        return session, csrf

    def session_user(self, session: str) -> tuple[User, str] | None:
        """``(user, csrf token)`` of a live session, or None."""
        if not session or len(session) > 200:
            return None
        with self.connect(write=False) as con:
            row = con.execute("SELECT u.id, u.name, u.role, s.csrf FROM sessions s JOIN users u ON u.id = s.user_id "
                              "WHERE s.id_hash = ? AND s.expires > ?", (_sha256(session), time.time())).fetchone()
        return (User(row["id"], row["name"], row["role"]), row["csrf"]) if row else None

    def logout(self, session: str) -> None:
        """End a session."""
        with self.connect() as con:
            con.execute("DELETE FROM sessions WHERE id_hash = ?", (_sha256(session),))

    # --- items and assignments ----------------------------------------------------------------------

    def add_items(self, items: Sequence[dict[str, Any]]) -> list[int]:
        """Insert new items (dicts with :class:`Item`'s fields but ``id``); ``(kind, key)`` pairs already present
        are skipped. Returns the ids of the inserted items, in order."""
        with self.connect() as con:
            return self._insert(con, items)

    def assign(self, item_ids: Sequence[int], per_item: int) -> int:
        """Give each item to ``per_item`` distinct reviewers, least-loaded first (ties by user id);
        returns the number of assignments made."""
        with self.connect() as con:
            return self._assign(con, item_ids, per_item)

    def add_and_assign(self, items: Sequence[dict[str, Any]], per_item: int) -> tuple[int, int, int]:
        """In one transaction: insert the new ``items`` and give every one of ``items`` that is in no queue (new,
        or left unassigned by an earlier import) to ``per_item`` reviewers. Returns ``(added, picked up,
        assignments)``; too few reviewers is a :class:`ConfigError` and changes nothing."""
        with self.connect() as con:
            self._reviewers(con, per_item)
            added = self._insert(con, items)
            queued = {(r["kind"], r["key"]) for r in con.execute(
                "SELECT DISTINCT i.kind, i.key FROM items i JOIN assignments a ON a.item_id = i.id")}
            wanted = [(it["kind"], it["key"]) for it in items if (it["kind"], it["key"]) not in queued]
            ids = [con.execute("SELECT id FROM items WHERE kind = ? AND key = ?", k).fetchone()["id"]
                   for k in dict.fromkeys(wanted)]
            made = self._assign(con, ids, per_item)
        return len(added), len(ids) - len(added), made

    def _insert(self, con: sqlite3.Connection, items: Sequence[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for it in items:
            if it["kind"] not in KINDS:
                raise ConfigError(f"item kind {it['kind']!r} is not one of {KINDS}")
            view = it.get("view") or None
            if con.execute("SELECT 1 FROM items WHERE kind = ? AND key = ?", (it["kind"], it["key"])).fetchone():
                if view:  # an item imported before its view was recorded learns it from the same input again
                    con.execute("UPDATE items SET view = ? WHERE kind = ? AND key = ? AND view IS NULL",
                                (view, it["kind"], it["key"]))
                continue
            cur = con.execute(
                "INSERT INTO items(kind, key, lesion, item_type, positive, source, height, width, images, "
                "payload, mask, view) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (it["kind"], it["key"], it["lesion"], it["item_type"], int(it["positive"]), it["source"],
                 int(it["height"]), int(it["width"]), json.dumps(it["images"]),
                 json.dumps(it["payload"], ensure_ascii=False),
                 json.dumps(it["mask"]) if it.get("mask") else None, view))
            ids.append(int(cur.lastrowid or 0))
        return ids

    def _reviewers(self, con: sqlite3.Connection, per_item: int) -> list[int]:
        reviewers = [r["id"] for r in con.execute("SELECT id FROM users WHERE role = 'reviewer' ORDER BY id")]
        if per_item < 1:
            raise ConfigError(f"--per-item must be at least 1, got {per_item}")
        if len(reviewers) < per_item:
            raise ConfigError(f"{per_item} reviewers per item requested but {self.path} has "
                              f"{len(reviewers)} reviewer(s); add them with `cxrground review add-user` "
                              "(nothing was imported)")
        return reviewers

    def _assign(self, con: sqlite3.Connection, item_ids: Sequence[int], per_item: int) -> int:
        reviewers = self._reviewers(con, per_item)
        load = {uid: 0 for uid in reviewers}
        nxt = dict.fromkeys(reviewers, 0)
        for r in con.execute("SELECT user_id, COUNT(*) AS n, MAX(position) AS last FROM assignments "
                             "GROUP BY user_id"):
            if r["user_id"] in load:
                load[r["user_id"]], nxt[r["user_id"]] = r["n"], r["last"] + 1
        made = 0
        for item_id in item_ids:
            chosen = sorted(reviewers, key=lambda u: (load[u], u))[:per_item]
            for uid in chosen:
                cur = con.execute("INSERT OR IGNORE INTO assignments(item_id, user_id, position) VALUES (?, ?, ?)",
                                  (item_id, uid, nxt[uid]))
                if cur.rowcount:
                    load[uid] += 1
                    nxt[uid] += 1
                    made += 1
        return made

    def items(self) -> list[Item]:
        """Every item, by id."""
        with self.connect(write=False) as con:
            return _items(con)

    def snapshot(self) -> Snapshot:
        """Every item and every assignment with its decisions, read in one read transaction (one consistent state
        of the database, whatever is written meanwhile)."""
        with self.connect(write=False) as con:
            items = _items(con)
            return Snapshot(items, _assignments(con, "1 = 1", ()))

    def _assignments(self, where: str, args: tuple[Any, ...]) -> list[Assignment]:
        with self.connect(write=False) as con:
            return _assignments(con, where, args)

    def assignments(self, user: User | None = None) -> list[Assignment]:
        """The assignments of ``user`` in queue order, or every assignment when ``user`` is None."""
        if user is None:
            return self._assignments("1 = 1", ())
        return self._assignments("a.user_id = ?", (user.id,))

    def queue(self, user: User | None = None) -> list[QueueRow]:
        """The assignments of ``user`` (every assignment when None) in queue order, as a queue lists them: one query
        that reads no item payload or mask into Python."""
        where, args = ("a.user_id = ?", (user.id,)) if user is not None else ("1 = 1", ())
        with self.connect(write=False) as con:
            rows = con.execute(
                "SELECT a.id, a.position, u.name AS uname, i.key, i.kind, i.lesion, i.item_type, "
                "json_extract(i.payload, '$.parts') AS parts, (SELECT group_concat(d.part, char(31)) FROM decisions d "
                "WHERE d.assignment_id = a.id) AS decided FROM assignments a JOIN items i ON i.id = a.item_id "
                f"JOIN users u ON u.id = a.user_id WHERE {where} ORDER BY a.user_id, a.position", args).fetchall()
        return [QueueRow(r["id"], r["key"], r["kind"], r["lesion"], r["item_type"], r["uname"], r["position"],
                         (json.loads(r["parts"]) if r["parts"] else []) or [ILS_PART],
                         sorted(r["decided"].split("\x1f")) if r["decided"] else [])
                for r in rows]

    def progress(self, user: User) -> tuple[int, int, int | None]:
        """``(done, total, next open assignment id)`` of ``user``'s queue, from two small queries."""
        with self.connect(write=False) as con:
            rows = con.execute(
                "SELECT a.id, json_array_length(json_extract(i.payload, '$.parts')) AS nparts, "
                "(SELECT COUNT(*) FROM decisions d WHERE d.assignment_id = a.id) AS ndec FROM assignments a "
                "JOIN items i ON i.id = a.item_id WHERE a.user_id = ? ORDER BY a.position", (user.id,)).fetchall()
        open_ids = [r["id"] for r in rows if r["ndec"] < (r["nparts"] or 1)]
        return len(rows) - len(open_ids), len(rows), open_ids[0] if open_ids else None

    def neighbours(self, assignment: Assignment) -> Neighbours:
        """Where ``assignment`` stands in its reviewer's queue: its index, the queue's length, the assignment before
        it and the first open one after it (wrapping around, itself excluded); a few indexed queries, no item read
        beyond what an open check needs."""
        user, position = assignment.user_id, assignment.position
        with self.connect(write=False) as con:
            index, total = con.execute(
                "SELECT COALESCE(SUM(position < ?), 0), COUNT(*) FROM assignments WHERE user_id = ?",
                (position, user)).fetchone()
            prev = con.execute("SELECT id FROM assignments WHERE user_id = ? AND position < ? "
                               "ORDER BY position DESC LIMIT 1", (user, position)).fetchone()
            later = (con.execute(f"{_OPEN_SQL} AND a.position > ? ORDER BY a.position LIMIT 1", (user, position))
                     .fetchone()
                     or con.execute(f"{_OPEN_SQL} AND a.position < ? ORDER BY a.position LIMIT 1", (user, position))
                     .fetchone())
        return Neighbours(index, total, prev[0] if prev else None, later[0] if later else None)

    def assignment(self, assignment_id: int, viewer: User) -> Assignment | None:
        """Assignment ``assignment_id`` if ``viewer`` may see it (their own, or any for an admin), else None."""
        if not -(2**63) <= assignment_id < 2**63:
            return None
        if viewer.is_admin:
            found = self._assignments("a.id = ?", (assignment_id,))
        else:
            found = self._assignments("a.id = ? AND a.user_id = ?", (assignment_id, viewer.id))
        return found[0] if found else None

    def record(self, assignment_id: int, part: str, decision: str, reason: str = "",
               mask: dict[str, Any] | None = None, comment: str = "") -> int:
        """Store (or replace) one decision unconditionally and commit it before returning; returns the decision row
        id (:meth:`write_decision` with no expected version)."""
        return self.write_decision(assignment_id, part, decision, reason, mask, comment=comment).id

    def write_decision(self, assignment_id: int, part: str, decision: str, reason: str = "",
                       mask: dict[str, Any] | None = None, *, comment: str = "", expected_version: int | None = None,
                       overwrite: bool = False, via: str = "") -> StoredDecision:
        """Store (or replace) one decision and append it to the history, in one transaction committed before
        returning. ``expected_version``: the part's version the decision was made over (0: none yet); when the part
        is at another version now (decided meanwhile), nothing is written and :class:`DecisionConflict` says what is
        stored. ``overwrite``: the reviewer confirmed replacing a decision made meanwhile; the write goes ahead
        whatever the version, and the history flags it. ``via``: how it came (``session``, ``token``), for the
        history. ``comment``: the reviewer's free text (stored as given; the app checks its length)."""
        mask_json = json.dumps(mask) if mask else None
        with self.connect() as con:
            owner = con.execute("SELECT user_id, item_id FROM assignments WHERE id = ?", (assignment_id,)).fetchone()
            if owner is None:
                raise InputError(f"no assignment {assignment_id}", self.path)
            now = con.execute("SELECT decision, reason, mask, updated, version, comment FROM decisions "
                              "WHERE assignment_id = ? AND part = ?", (assignment_id, part)).fetchone()
            current = int(now["version"]) if now else 0
            if expected_version is not None and expected_version != current and not overwrite:
                raise DecisionConflict(_stored(now), expected_version)
            stamp = time.time()
            con.execute(
                "INSERT INTO decisions(assignment_id, part, decision, reason, mask, updated, version, comment) "
                "VALUES (?, ?, ?, ?, ?, ?, 1, ?) ON CONFLICT(assignment_id, part) DO UPDATE SET "
                "decision = excluded.decision, reason = excluded.reason, mask = excluded.mask, "
                "updated = excluded.updated, version = decisions.version + 1, comment = excluded.comment",
                (assignment_id, part, decision, reason, mask_json, stamp, comment))
            row = con.execute("SELECT id, version FROM decisions WHERE assignment_id = ? AND part = ?",
                              (assignment_id, part)).fetchone()
            con.execute("INSERT INTO decision_history(assignment_id, item_id, part, user_id, decision, reason, mask, "
                        "at, version, replaced_version, overwrite, via, comment) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (assignment_id, owner["item_id"], part, owner["user_id"], decision, reason, mask_json, stamp,
                         row["version"], current or None, int(overwrite), via, comment))
        return StoredDecision(int(row["id"]), int(row["version"]), stamp)

    def write_comment(self, assignment_id: int, part: str, comment: str, *, expected_version: int | None = None,
                      overwrite: bool = False, via: str = "") -> StoredDecision:
        """Change only the comment of the part's stored decision (its decision, reason and mask stay), with the same
        rules as :meth:`write_decision`: the version goes up by one, the write is appended to the history (flagged as
        a comment edit), ``expected_version`` / ``overwrite`` guard against a decision made meanwhile
        (:class:`DecisionConflict`). A part without a decision is an :class:`InputError` (a comment is kept with a
        decision)."""
        with self.connect() as con:
            owner = con.execute("SELECT user_id, item_id FROM assignments WHERE id = ?", (assignment_id,)).fetchone()
            if owner is None:
                raise InputError(f"no assignment {assignment_id}", self.path)
            now = con.execute("SELECT id, decision, reason, mask, updated, version, comment FROM decisions "
                              "WHERE assignment_id = ? AND part = ?", (assignment_id, part)).fetchone()
            current = int(now["version"]) if now else 0
            if expected_version is not None and expected_version != current and not overwrite:
                raise DecisionConflict(_stored(now), expected_version)
            if now is None:
                raise InputError(f"part {part!r} of assignment {assignment_id} has no decision to comment on "
                                 "(a comment is kept with a decision)", self.path)
            stamp = time.time()
            con.execute("UPDATE decisions SET comment = ?, updated = ?, version = version + 1 WHERE id = ?",
                        (comment, stamp, now["id"]))
            con.execute("INSERT INTO decision_history(assignment_id, item_id, part, user_id, decision, reason, mask, "
                        "at, version, replaced_version, overwrite, via, comment, edit) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'comment')",
                        (assignment_id, owner["item_id"], part, owner["user_id"], now["decision"], now["reason"],
                         now["mask"], stamp, current + 1, current, int(overwrite), via, comment))
        return StoredDecision(int(now["id"]), current + 1, stamp)

    def unassign(self, reviewer: str, *, keys: Sequence[str] = (), kind: str | None = None,
                 undecided: bool = False, force: bool = False) -> list[dict[str, Any]]:
        """Remove assignments of the reviewer named ``reviewer``: those of the items with one of ``keys`` (of
        ``kind`` when given), or with ``undecided`` every one of theirs without any decision. An assignment with a
        decision is refused (:class:`ConfigError`, nothing removed) unless ``force``: its decisions leave the
        current ones (and the export) but stay in the history, marked removed. Returns what was removed, queue order:
        ``{kind, key, decided}`` (``decided``: the parts that had a decision). An unknown reviewer is an
        :class:`InputError`; nothing matching is an empty list."""
        if kind is not None and kind not in KINDS:
            raise ConfigError(f"item kind {kind!r} is not one of {KINDS}")
        with self.connect() as con:
            user = con.execute("SELECT id FROM users WHERE name = ?", (reviewer,)).fetchone()
            if user is None:
                raise InputError(f"no user {reviewer!r} in the review database", self.path)
            rows = con.execute(
                "SELECT a.id, i.kind, i.key, (SELECT group_concat(d.part, char(31)) FROM decisions d "
                "WHERE d.assignment_id = a.id) AS decided FROM assignments a JOIN items i ON i.id = a.item_id "
                "WHERE a.user_id = ? ORDER BY a.position", (user["id"],)).fetchall()
            wanted = set(keys)
            chosen = [r for r in rows if (undecided and not r["decided"])
                      or (r["key"] in wanted and (kind is None or r["kind"] == kind))]
            decided = [r for r in chosen if r["decided"]]
            if decided and not force:
                names = ", ".join(f"{r['kind']} {r['key']}" for r in decided[:5]) + (" ..." if len(decided) > 5 else "")
                raise ConfigError(f"{reviewer} has decided {len(decided)} of these assignment(s) ({names}); nothing "
                                  "was removed (--force removes them, their decisions kept in `review history`)")
            stamp = time.time()
            for r in chosen:
                con.execute("UPDATE decision_history SET assignment_id = NULL, removed = ? WHERE assignment_id = ?",
                            (stamp, r["id"]))
                con.execute("DELETE FROM decisions WHERE assignment_id = ?", (r["id"],))
                con.execute("DELETE FROM assignments WHERE id = ?", (r["id"],))
        return [{"kind": r["kind"], "key": r["key"], "decided": sorted(r["decided"].split("\x1f")) if r["decided"]
                 else []} for r in chosen]

    def history(self, *, key: str | None = None, user: str | None = None) -> list[dict[str, Any]]:
        """Every decision ever written (oldest first), replaced ones included: ``{at, reviewer, assignment, kind, key,
        part, decision, reason, comment, mask, version, replaced_version, overwrite, via, comment_only, removed,
        latest}`` (``comment_only``: the write changed only the comment; ``removed``: when the assignment was removed
        (``assignment`` is None then), else None; ``latest``: it is the part's decision now); ``key`` / ``user``: only
        that item key / reviewer name."""
        where, args = ["1 = 1"], []
        if key is not None:
            where.append("i.key = ?")
            args.append(key)
        if user is not None:
            where.append("u.name = ?")
            args.append(user)
        with self.connect(write=False) as con:
            rows = con.execute(
                "SELECT h.*, u.name AS reviewer, i.kind, i.key, d.version AS now_version FROM decision_history h "
                "JOIN items i ON i.id = h.item_id "
                "JOIN users u ON u.id = h.user_id LEFT JOIN decisions d ON d.assignment_id = h.assignment_id "
                f"AND d.part = h.part WHERE {' AND '.join(where)} ORDER BY h.at, h.id", tuple(args)).fetchall()
        return [{"at": r["at"], "reviewer": r["reviewer"], "assignment": r["assignment_id"], "kind": r["kind"],
                 "key": r["key"], "part": r["part"], "decision": r["decision"], "reason": r["reason"],
                 "comment": r["comment"], "mask": json.loads(r["mask"]) if r["mask"] else None, "version": r["version"],
                 "replaced_version": r["replaced_version"], "overwrite": bool(r["overwrite"]), "via": r["via"],
                 "comment_only": r["edit"] == "comment", "removed": r["removed"],
                 "latest": r["version"] == r["now_version"]} for r in rows]
