"""The manifest: the published record of a blessing, validated on read and on write."""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bless._version import __version__
from bless.core.factors import canonical_json, config_hash, is_config_hash
from bless.core.relpath import check_relative_path
from bless.core.schemas import listing_conforms, listing_over_limit, schema_errors
from bless.core.untrusted_text import shown
from bless.core.verify import FileEntry, TreeListing
from bless.errors import ManifestInvalidError
from bless.system.bounded_read import NotRegularFileError, open_regular

SCHEMA_VERSION = 1
MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class CacheTree:
    """The blessed cache directory as recorded: versioned id + every file and directory."""

    dir_id: str
    mount_path: str
    files: tuple[FileEntry, ...]
    dirs: tuple[str, ...]
    total_size: int
    tree_sha256: str


@dataclass(frozen=True)
class Manifest:
    """A blessing. ``trials``, ``golden``, ``artifacts`` and ``provenance`` are JSON objects."""

    config_hash: str
    factors: Mapping[str, Any]
    created: str
    tool_version: str
    profile_name: str
    cache: CacheTree
    artifacts: Mapping[str, Any]
    trials: Mapping[str, Any]
    golden: Sequence[Mapping[str, Any]]
    provenance: Mapping[str, Any]
    #: What the blessing covers beyond its start (:mod:`bless.core.coverage`); None in blessings made before it.
    coverage: Mapping[str, Any] | None = None

    @property
    def engine(self) -> str:
        """The engine's name, ``?`` when the factors do not say (read defensively: factors are data)."""
        name = factor_field(self.factors, "engine", "name")
        return name if isinstance(name, str) else "?"

    @property
    def model_label(self) -> str:
        """``id@revision12`` (or the local dir's content hash), ``?`` for what the factors do not say."""
        model_id = factor_field(self.factors, "model", "id")
        label = model_id if isinstance(model_id, str) else "?"
        for key in ("revision", "content_sha256"):
            revision = factor_field(self.factors, "model", key)
            if isinstance(revision, str) and revision:
                return f"{label}@{revision[:12]}"
        return label

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (schema ``manifest.v1``)."""
        # By hand (not JsonForm): the manifest.v1 shape (``tool``, ``cache``), ``coverage`` only when recorded.
        return {
            "schema_version": SCHEMA_VERSION,
            "config_hash": self.config_hash,
            "factors": json.loads(canonical_json(self.factors)),
            "created": self.created,
            "tool": {"name": "bless", "version": self.tool_version},
            "profile_name": self.profile_name,
            "cache": {
                "dir_id": self.cache.dir_id,
                "mount_path": self.cache.mount_path,
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.cache.files],
                "dirs": list(self.cache.dirs),
                "total_size": self.cache.total_size,
                "tree_sha256": self.cache.tree_sha256,
            },
            "artifacts": dict(self.artifacts),
            "trials": dict(self.trials),
            "golden": [dict(item) for item in self.golden],
            "provenance": dict(self.provenance),
        } | ({"coverage": dict(self.coverage)} if self.coverage is not None else {})

    def to_json_bytes(self) -> bytes:
        """Serialized, validated manifest (pretty, stable key order, trailing newline)."""
        document = self.to_dict()
        validate_document(document, where="manifest being written")
        text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
        return (text + "\n").encode("utf-8")


def factor_field(factors: Mapping[str, Any], section: str, key: str) -> Any:
    """``factors[section][key]``, or None when the section is not an object or lacks the key."""
    part = factors.get(section)
    return part.get(key) if isinstance(part, Mapping) else None


def tree_sha256(files: Sequence[FileEntry], dirs: Sequence[str]) -> str:
    """A digest of the whole listing; its prefix names archived blessings."""
    listing = {"files": [[f.path, f.size, f.sha256] for f in files], "dirs": list(dirs)}
    return hashlib.sha256(canonical_json(listing)).hexdigest()


def new_dir_id(listing: TreeListing, now: datetime | None = None) -> str:
    """Versioned blessed-dir name: UTC timestamp + 12 hex of the tree digest."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{tree_sha256(listing.files, listing.dirs)[:12]}"


def cache_tree_from_listing(listing: TreeListing, *, mount_path: str, dir_id: str | None = None) -> CacheTree:
    """Record a hashed staged tree as the manifest's cache section."""
    return CacheTree(
        dir_id=dir_id or new_dir_id(listing),
        mount_path=mount_path,
        files=tuple(listing.files),
        dirs=tuple(listing.dirs),
        total_size=listing.total_size,
        tree_sha256=tree_sha256(listing.files, listing.dirs),
    )


def default_provenance(runtime: str, **extra: Any) -> dict[str, Any]:
    """Host + runtime + whatever the caller adds (image ID, run id, timings)."""
    return {"host": socket.gethostname(), "runtime": runtime, **extra}


def _schema_errors(document: dict[str, Any]) -> list[str]:
    """The schema's errors for ``document``, its file listing checked by the schema's own rules in code.

    jsonschema needs about a minute for a legal manifest of a million files; the listing's entries are
    checked in a loop (:func:`bless.core.schemas.listing_conforms`, the same rules read from the schema) and
    the schema validates the rest with one entry of each list left in. Entries that do not conform are
    left to the schema, whose words the refusal then uses.
    """
    cache = document.get("cache")
    if isinstance(cache, dict):
        too_long = listing_over_limit(cache.get("files"), cache.get("dirs"))
        if too_long is not None:  # refused on the count alone: no entry is validated
            return [too_long]
    if isinstance(cache, dict) and listing_conforms(cache.get("files"), cache.get("dirs")):
        light = {**document, "cache": {**cache, "files": cache["files"][:1], "dirs": cache["dirs"][:1]}}
        return schema_errors("manifest.v1", light)
    return schema_errors("manifest.v1", document)


def _non_finite_numbers(document: dict[str, Any]) -> list[str]:
    """NaN and the infinities: not JSON, and the schema's bounds let NaN through (every comparison is false).

    The file listing is left out (its sizes are checked as integers by :func:`listing_conforms` and the schema).
    """
    found: list[str] = []
    pending: list[tuple[str, Any]] = [
        (key, value if key != "cache" or not isinstance(value, dict) else {**value, "files": [], "dirs": []})
        for key, value in document.items()
    ]
    while pending:
        where, value = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            found.append(f"{where}: {value} is not a JSON number")
        elif isinstance(value, dict):
            pending.extend((f"{where}.{key}", item) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((f"{where}[{index}]", item) for index, item in enumerate(value))
    return sorted(found)


def validate_document(document: Any, *, where: str) -> None:
    """Schema validation plus the checks a schema cannot express; raises ManifestInvalidError."""
    _validated_files(document, where=where)


def _validated_files(document: Any, *, where: str) -> tuple[FileEntry, ...]:
    """:func:`validate_document`, returning the listing's entries it built (built once for a million files)."""
    if not isinstance(document, dict):
        raise ManifestInvalidError(f"{where}: top level is {type(document).__name__}, not an object")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ManifestInvalidError(
            f"{where}: unknown manifest schema_version {version!r}; this bless ({__version__}) reads version "
            f"{SCHEMA_VERSION}",
            hint="use the bless version that wrote it, or re-bless with this one",
        )
    errors = _non_finite_numbers(document) or _schema_errors(document)
    if errors:
        raise ManifestInvalidError(
            f"{where}: " + "; ".join(errors),
            hint="a manifest must not be edited by hand; restore it from the store or re-bless",
            details={"errors": errors},
        )
    if not is_config_hash(document["config_hash"]):  # the one rule (bless.core.factors), whatever the schema spells
        raise ManifestInvalidError(f"{where}: config_hash {document['config_hash']!r} is not a config hash")
    cache = document["cache"]
    seen: set[str] = set()
    previous = ""
    for entry in cache["files"]:
        path = entry["path"]
        try:
            check_relative_path(path)
        except ValueError as exc:
            raise ManifestInvalidError(f"{where}: cache.files: bad path {path!r}: {exc}") from None
        if path in seen:
            raise ManifestInvalidError(f"{where}: cache.files: duplicate path {path!r}")
        if path < previous:
            raise ManifestInvalidError(f"{where}: cache.files: not sorted at {path!r}")
        seen.add(path)
        previous = path
    for path in cache["dirs"]:
        try:
            check_relative_path(path)
        except ValueError as exc:
            raise ManifestInvalidError(f"{where}: cache.dirs: bad path {path!r}: {exc}") from None
        if path in seen:
            raise ManifestInvalidError(f"{where}: {path!r} is listed both as a file and a directory")
    if len(set(cache["dirs"])) != len(cache["dirs"]):
        raise ManifestInvalidError(f"{where}: cache.dirs: duplicate entries")
    _refuse_files_as_parents(seen, cache["dirs"], where)
    total = sum(entry["size"] for entry in cache["files"])
    if total != cache["total_size"]:
        raise ManifestInvalidError(f"{where}: cache.total_size is {cache['total_size']}, files add up to {total}")
    try:
        files = tuple(FileEntry(e["path"], e["size"], e["sha256"]) for e in cache["files"])
    except ValueError as exc:  # e.g. a size of 100.0: the schema's "integer" admits integral floats
        raise ManifestInvalidError(f"{where}: cache.files: {exc}") from None
    if tree_sha256(files, cache["dirs"]) != cache["tree_sha256"]:
        raise ManifestInvalidError(f"{where}: cache.tree_sha256 does not match the listed files")
    try:
        actual = config_hash(document["factors"])
    except (ValueError, RecursionError) as exc:  # NaN/inf, lone surrogates, absurd nesting
        raise ManifestInvalidError(f"{where}: factors cannot be hashed: {exc}") from None
    if actual != document["config_hash"]:
        raise ManifestInvalidError(
            f"{where}: config_hash {document['config_hash'][:16]}... does not match its factors ({actual[:16]}...)",
            hint="the manifest was edited or corrupted; restore it from the store or re-bless",
        )
    return files


def _refuse_files_as_parents(files: set[str], dirs: Sequence[str], where: str) -> None:
    """No listed path may lie below a listed file (``x`` and ``x/y``): no tree holds both.

    A reader that builds the tree (a pull) would find ``x`` there when it makes directory ``x``; each
    path is checked once per ``/`` it holds, so this costs no more than reading the listing.
    """
    for path in (*files, *dirs):
        cut = path.find("/")
        while cut != -1:
            if path[:cut] in files:
                raise ManifestInvalidError(
                    f"{where}: {shown(path)!r} lies below {shown(path[:cut])!r}, which is listed as a file",
                    hint="no directory tree holds both; the manifest was crafted or corrupted",
                )
            cut = path.find("/", cut + 1)


def manifest_from_dict(document: Any, *, where: str = "manifest") -> Manifest:
    """Validate a parsed manifest and build the model."""
    files = _validated_files(document, where=where)
    cache = document["cache"]
    return Manifest(
        config_hash=document["config_hash"],
        factors=document["factors"],
        created=document["created"],
        tool_version=document["tool"]["version"],
        profile_name=document["profile_name"],
        cache=CacheTree(
            dir_id=cache["dir_id"],
            mount_path=cache["mount_path"],
            files=files,
            dirs=tuple(cache["dirs"]),
            total_size=cache["total_size"],
            tree_sha256=cache["tree_sha256"],
        ),
        artifacts=document["artifacts"],
        trials=document["trials"],
        golden=document["golden"],
        provenance=document["provenance"],
        coverage=document.get("coverage"),
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: with a duplicate, which value counts depends on the reader."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise ValueError(f"duplicate key {shown(key)!r}")
        document[key] = value
    return document


def _reject_constant(name: str) -> Any:
    """``NaN``/``Infinity`` are not JSON (Python's parser accepts them by default)."""
    raise ValueError(f"{name} is not a JSON value")


def strict_json(text: str | bytes) -> Any:
    """Parse JSON by the one rule of every document bless reads from others: no duplicate key, no NaN.

    Manifests, OCI manifests and TUF metadata all go through here: with a duplicate key, which value
    counts would depend on the reader (a registry, python-tuf, a person), so such a document is refused.

    Raises:
        ValueError: not JSON, a duplicate key, NaN/Infinity (json.JSONDecodeError is a ValueError);
            UnicodeDecodeError for bytes that are not UTF-8; RecursionError for absurd nesting.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)


def load_manifest(path: Path) -> Manifest:
    """Read and validate one manifest file; every failure is a ManifestInvalidError naming the file."""
    return read_manifest(path)[0]


#: What to do about a manifest file bless cannot take (a refusal names the file and what is wrong).
_DAMAGED = "the file is truncated, corrupted or not written by bless; restore it from the store's archive or re-bless"
_UNREADABLE = "run as a user who may read the manifests directory (its owner), or fix the file's permissions"
_NOT_A_MANIFEST_FILE = "a manifest is a regular file: remove what stands in its place, then restore or re-bless it"


def read_manifest(path: Path) -> tuple[Manifest, bytes]:
    """:func:`load_manifest`, and the exact bytes it parsed (what a signature covers: checked without a re-read)."""
    where = shown(str(path))  # a file name is data: messages show it escaped, on one line
    try:
        # Never blocking (a FIFO named *.json must not hang a reader), never through a link (a manifest is never one).
        handle = open_regular(path)
    except NotRegularFileError:
        raise ManifestInvalidError(f"{where}: not a regular file", hint=_NOT_A_MANIFEST_FILE) from None
    except OSError as exc:
        raise ManifestInvalidError(f"{where}: cannot open: {exc.strerror or exc}", hint=_UNREADABLE) from None
    try:
        with handle:
            info = os.fstat(handle.fileno())
            if info.st_size > MAX_MANIFEST_BYTES:
                raise ManifestInvalidError(f"{where}: {info.st_size} bytes, more than the {MAX_MANIFEST_BYTES} allowed")
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestInvalidError(f"{where}: cannot read: {exc.strerror or exc}", hint=_UNREADABLE) from None
    try:
        document = strict_json(raw)
    except UnicodeDecodeError as exc:
        raise ManifestInvalidError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})", hint=_DAMAGED) from None
    except json.JSONDecodeError as exc:
        raise ManifestInvalidError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            hint=_DAMAGED,
        ) from None
    except RecursionError:
        raise ManifestInvalidError(f"{where}: JSON nested too deeply", hint=_DAMAGED) from None
    except ValueError as exc:  # from _reject_constant
        raise ManifestInvalidError(f"{where}: not valid JSON ({exc})", hint=_DAMAGED) from None
    return manifest_from_dict(document, where=where), raw
