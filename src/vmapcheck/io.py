"""Atomic file output and verified array files.

Every output is written to a temporary file in the destination folder and renamed into
place, so an interrupted stage never leaves half a file for DVC to cache. Arrays are
stored as ``.npz`` read with ``allow_pickle=False`` or as safetensors, never pickle.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, Union, cast, get_args, get_origin, get_type_hints, is_typeddict

import numpy as np

from vmapcheck.errors import ArtifactError, os_expected
from vmapcheck.pause import pause_point


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# The write failures that are the machine's, not the program's: no permission, a
# read-only file system, no space or quota left, a file size limit, and an output folder
# that is a mount point (EBUSY: it cannot be swapped for the new one by a rename).
_CANNOT_WRITE = {
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EBUSY,
}


@contextlib.contextmanager
def _writing(path: Path, what: str) -> Iterator[None]:
    """Turn a failure to write ``path`` (see ``_CANNOT_WRITE``) into an ArtifactError
    naming the file, its folder and the cause; ``what`` says what stays as it was."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _CANNOT_WRITE:
            raise
        cause = exc.strerror or errno.errorcode.get(exc.errno or 0, "")
        raise ArtifactError(
            f"{path}: cannot write it in {path.parent} ({cause}{space_note(exc, path.parent)})"
            f"; {what}"
        ) from None


# The write failures that mean "no room": the disk or quota is full, or a file size limit.
NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def space_note(exc: OSError, folder: Path) -> str:
    """For a write that failed for lack of room (:data:`NO_ROOM`): ``"; 12 kB free in
    <folder>"`` (the first existing folder at or above it), and for EFBIG the process's
    file size limit (``ulimit -f``); else ``""``."""
    if exc.errno not in NO_ROOM:
        return ""
    note = f"; {free_space(folder)}"
    if exc.errno == errno.EFBIG:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY:
            note += f", and this process may write files of at most {soft} bytes (ulimit -f)"
    return note


def free_space(folder: Path) -> str:
    """``"<n> free in <folder>"`` (bytes, kB, MB or GB), for the first existing folder at
    or above ``folder``; ``"free space in <folder> unknown"`` when it cannot be read."""
    here = Path(folder)
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        free = float(shutil.disk_usage(here).free)
    except OSError:
        return f"free space in {here} unknown"
    for unit in ("bytes", "kB", "MB", "GB"):
        if free < 1024 or unit == "GB":
            shown = f"{free:.0f} {unit}" if unit == "bytes" else f"{free:.1f} {unit}"
            return f"{shown} free in {here}"
        free /= 1024
    return f"free space in {here} unknown"  # not reached


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp file beside ``path``; on success it replaces ``path`` in one rename.

    Raises:
        ArtifactError: the folder cannot be written (permissions, no space left, ...),
            naming the file; ``path`` is left as it was.
    """
    path = Path(path)
    with _writing(path, "the file is as it was before"):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            # mkstemp makes the file private (0600); outputs get the usual permissions.
            os.chmod(tmp, 0o666 & ~_umask())
            yield tmp_path
            pause_point(f"write {path.name}")  # a test may kill the stage here
            os.replace(tmp_path, path)
        finally:
            tmp_path.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(Path(path), json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as fh:
        # Never pickled: load_npz refuses object arrays, so none is written either.
        np.savez(fh, allow_pickle=False, **{k: np.asarray(v) for k, v in arrays.items()})


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Build a folder output in a sibling temp folder; swap it in only on success.

    Raises:
        ArtifactError: the folder cannot be written (permissions, no space left, ...),
            naming it; ``path`` is left as it was.
    """
    path = Path(path)
    with _writing(path, "the folder is as it was before"):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            os.chmod(tmp, 0o777 & ~_umask())
            try:
                yield tmp
            except ArtifactError as exc:
                # A file of the folder could not be written: named within the output
                # folder, not the temp folder it was being built in.
                message = str(exc).replace(str(tmp), str(path))
                kept = "the folder is as it was before"
                raise ArtifactError(message.replace("the file is as it was before", kept)) from None
            pause_point(f"write {path.name}/")  # a test may kill the stage here
            old = None
            if path.exists():
                old = path.with_name(f".{path.name}.old-{os.getpid()}")
                os.replace(path, old)
            os.replace(tmp, path)
            if old is not None:
                shutil.rmtree(old)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_json(path: Path) -> Any:
    path = Path(path)
    try:
        text = read_text_bounded(path, JSON_MAX_BYTES, "a JSON file")
        return json.loads(text)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not found; has the stage that writes it run?") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path}: not UTF-8 text (byte {exc.start}): not JSON") from None
    except RecursionError:
        raise ArtifactError(
            f"{path}: expected JSON nested a few hundred levels at most, found it nested too "
            "deeply to read"
        ) from None


# The largest JSON file vmapcheck reads (its own reports are kilobytes to a few MB): a
# bigger one is refused with its size before it is read into memory.
JSON_MAX_BYTES = 256 * 2**20

# What ``stat`` calls each kind of file that is not a regular one.
_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """ "a regular file", "a directory", "a FIFO (named pipe)", ... for an ``st_mode``."""
    return next((name for test, name in _FILE_KINDS if test(mode)), "a regular file")


def require_regular_file(path: Path, what: str) -> None:
    """Refuse ``path`` unless it is (or links to) a regular file, before anything opens
    it: opening a FIFO blocks until a writer comes, a device such as /dev/zero never
    ends, a directory fails with a message that names no expectation.

    Raises:
        ArtifactError: naming the file, ``what`` it should be and the kind found.
        OSError: it cannot be reached (missing, a symlink loop, no permission).
    """
    mode = os.stat(path).st_mode  # follows symlinks: the file they lead to is checked
    if not stat.S_ISREG(mode):
        raise ArtifactError(f"{path}: expected {what} (a regular file), found {file_kind(mode)}")


def read_bytes_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes
    (``what`` names it in the refusal: "a params file").

    Its type is checked before it is opened (a FIFO would block the open, a device such
    as /dev/zero never ends), and no more than ``limit`` + 1 bytes are read (a file that
    grows meanwhile is refused too).

    Raises:
        ArtifactError: not a regular file, or larger than ``limit``: naming the file,
            what was expected and what was found (its kind, its size).
        OSError: it cannot be reached or read (missing, a symlink loop, no permission).
    """
    path = Path(path)
    require_regular_file(path, what)
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
        size = max(os.fstat(fh.fileno()).st_size, len(data))
    if len(data) > limit:
        raise ArtifactError(
            f"{path}: expected {what} of at most {limit:,} bytes, found {size:,} bytes or more"
        )
    return data


def read_text_bounded(path: Path, limit: int, what: str) -> str:
    """:func:`read_bytes_bounded` decoded as UTF-8 (UnicodeDecodeError when it is not)."""
    return read_bytes_bounded(path, limit, what).decode("utf-8")


def output_file_problem(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (checked before the work whose result it
    would hold), or None: it can. ``path`` must not be a directory or a special file; its
    folder (or the nearest one above that exists: missing ones are created) must be a
    directory where a file can be made, tried for real (permissions alone do not tell a
    read-only file system or /proc)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a file where a folder of the path should be, a link loop
        return os_expected(exc)
    if mode is not None and not stat.S_ISREG(mode):
        return f"expected a file path, found {file_kind(mode)}"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"expected a folder at {folder}, found {file_kind(folder.stat().st_mode)}"
    try:
        fd, probe = tempfile.mkstemp(prefix=".vmapcheck-probe-", dir=folder)
    except OSError as exc:
        return f"expected a folder it can write in, {folder} refuses ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


def read_json_object(path: Path, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """:func:`read_json` of a file that must hold a JSON object (with ``keys``).

    Raises:
        ArtifactError: not found, not JSON, not an object, or a key missing; naming it.
    """
    found = read_json(path)
    if not isinstance(found, dict):
        raise ArtifactError(
            f"{path}: expected a JSON object, found a {type(found).__name__}; rerun the "
            "stage that writes it (`dvc repro`)"
        )
    missing = [k for k in keys if k not in found]
    if missing:
        raise ArtifactError(
            f"{path}: expected the keys {', '.join(missing)}, found none of them; rerun the "
            "stage that writes it (`dvc repro`)"
        )
    return found


# A TypeVar, not `def read_json_typed[T]`: PEP 695 syntax needs Python 3.12 (3.11 runs it).
_T = TypeVar("_T")


def read_json_typed(path: Path, schema: type[_T]) -> _T:
    """:func:`read_json_object` of a file written from ``schema`` (a TypedDict), every
    key its type requires present, at every level it types (:func:`missing_keys`).

    Raises:
        ArtifactError: not found, not JSON, not an object, or keys missing: naming the
            file and each missing key's path (the first eight).
    """
    data = read_json_object(path)
    missing = missing_keys(data, schema)
    if missing:
        shown = ", ".join(missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise ArtifactError(
            f"{path}: expected the keys of a {schema.__name__}, missing {shown}{more} "
            "(written by an older vmapcheck? rerun `dvc repro`)"
        )
    return cast(_T, data)


@functools.cache
def _type_hints(schema: Any) -> dict[str, Any]:
    """``schema``'s annotations, evaluated once per type (not once per record read)."""
    return get_type_hints(schema)


def missing_keys(data: Any, schema: Any, where: str = "") -> list[str]:
    """The required keys ``data`` lacks, as dotted paths from the top (``cases.zeros.
    pairs``, ``stages.2.finding.stage``), checked through every level ``schema`` (a
    TypedDict) types: a nested TypedDict, a ``dict[str, <TypedDict>]``, a
    ``list[<TypedDict>]``, a ``<TypedDict> | None``. A value of the
    wrong kind where an object is expected is named like a missing key."""
    if is_typeddict(schema):
        if not isinstance(data, dict):
            named = where.rstrip(".") or "(top)"
            return [f"{named} (expected an object, found {type(data).__name__})"]
        found = [f"{where}{k}" for k in sorted(schema.__required_keys__ - set(data))]
        for key, hint in _type_hints(schema).items():
            if key in data:
                found += missing_keys(data[key], hint, f"{where}{key}.")
        return found
    kind, inner = _nested(schema)
    if kind == "optional":
        return [] if data is None else missing_keys(data, inner, where)
    if kind == "mapping" and isinstance(data, dict):
        return [m for k, v in data.items() for m in missing_keys(v, inner, f"{where}{k}.")]
    if kind == "sequence" and isinstance(data, list):
        return [m for i, v in enumerate(data) for m in missing_keys(v, inner, f"{where}{i}.")]
    return []


@functools.cache
def _nested(hint: Any) -> tuple[str, Any]:
    """What :func:`missing_keys` looks into under ``hint``, worked out once per type:
    ``("optional", T)`` for ``T | None``, ``("mapping", T)`` for ``dict[str, T]``,
    ``("sequence", T)`` for ``list[T]``, and ``("", None)`` for anything it does not
    check."""
    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) in (Union, UnionType):
        return ("optional", args[0]) if len(args) == 1 else ("", None)
    if get_origin(hint) is dict and len(args) == 2:
        return "mapping", args[1]
    if get_origin(hint) is list and len(args) == 1:
        return "sequence", args[0]
    return "", None


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """Load every array of an .npz file; object arrays (pickle) are refused."""
    path = Path(path)
    try:
        require_regular_file(path, "an .npz file")  # a FIFO would block the open
        # Opened here, so that a file np.load refuses is closed too.
        with open(path, "rb") as fh:
            # An .npz is a zip archive: anything else np.load would try as a pickle.
            if fh.read(4) not in (b"PK\x03\x04", b"PK\x05\x06"):
                raise zipfile.BadZipFile("it does not begin as a zip archive does")
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as data:
                return {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not found; has the stage that writes it run?") from None
    except ValueError as exc:
        raise ArtifactError(f"{path}: refused ({exc})") from None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        # Cut short, emptied or not an .npz at all (the file the stage before wrote).
        raise ArtifactError(
            f"{path}: not a whole .npz file ({type(exc).__name__}: {exc}); rerun the stage "
            "that writes it (`dvc repro`)"
        ) from None
