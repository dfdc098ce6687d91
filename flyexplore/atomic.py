"""Writing output files so that no failure can destroy them: the one place every output of
flyexplore goes through (result files, reports, figures, tables, JSON and Markdown summaries).

A file is written whole or not at all (:func:`write_file`, :func:`write_text`,
:func:`write_bytes`): into a temporary file beside it (``.<name>.<random>.tmp``, same folder so
same file system), flushed to the disk (``fsync``), renamed onto the target (``os.replace``,
atomic on POSIX and Windows), then the folder's entry flushed too where the OS allows it. On any
failure (a full disk, a quota, an interrupt) the temporary file is removed, the old file is
untouched (a new one is not created, nor the folders made for it) and :class:`WriteError` names
the file and the OS's reason. A step summary (``$GITHUB_STEP_SUMMARY``) is appended to, not
replaced: :func:`append_text` adds a whole block or nothing (cut back to its old size on
failure). Writers that fill many files at once (kaleido's images) use the parts:
:func:`temp_for`, :func:`commit`, :func:`discard`, :func:`write_error`.

Logs that grow line by line (a worker's log, ``run/envab.py``) and the SQLite journal (its own
transactions) are not written here.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from flyexplore.errors import WriteError

#: What a failed write left, for a file that existed and for a new one (:class:`WriteError`).
OLD_KEPT, NONE_MADE = "the old file is unchanged", "nothing was written"


def write_error(path: str | os.PathLike, exc: OSError, existed: bool | None = None,
                left: str | None = None) -> WriteError:
    """The :class:`WriteError` for a failed write of ``path`` from the OS's ``exc``: its errno and
    the OS's text for it (``[Errno 28] No space left on device``; pyarrow's longer text becomes
    this too), and what is left: ``left``, else by ``existed`` the old file kept or nothing
    written (``None``: whether ``path`` exists now)."""
    if left is None:
        existed = os.path.exists(path) if existed is None else existed
        left = OLD_KEPT if existed else NONE_MADE
    why = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc) or type(exc).__name__)
    return WriteError(exc.errno or None, why, str(path), left)


def _dest(path: Path) -> Path:
    """The file a write of ``path`` replaces: ``path``, or the file a symbolic link at ``path``
    points to (the link stays a link)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def temp_for(path: str | os.PathLike) -> Path:
    """A new empty temporary file beside ``path`` (``.<name>.<random>.tmp``, mode 0600; beside
    the file a symbolic link points to), for a writer to fill and :func:`commit` (or
    :func:`discard`). The folder must exist. Raises :class:`WriteError` when it cannot be made."""
    p = Path(path)
    d = _dest(p)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{d.name}.", suffix=".tmp", dir=d.parent)
    except OSError as exc:
        raise write_error(p, exc) from exc
    os.close(fd)
    return Path(tmp)


def discard(tmp: str | os.PathLike) -> None:
    """Remove a temporary file of :func:`temp_for` if it is still there (never raises)."""
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename in it) to the disk; a no-op where folders cannot be
    opened (Windows) or synced (some network file systems)."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Put the filled temporary file ``tmp`` (of :func:`temp_for`) in place of ``path``: its data
    flushed to the disk, the mode of the file it replaces (a new file: 0644), renamed onto
    ``path`` (onto the file a symbolic link there points to), the folder flushed. On failure ``tmp`` is removed and ``path`` is as it was; raises
    :class:`WriteError`. Returns ``Path(path)``."""
    p = Path(path)
    dest = _dest(p)
    existed = dest.exists()
    try:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)   # a full disk can show first here (delayed allocation, network file systems)
        finally:
            os.close(fd)
        try:
            mode = stat.S_IMODE(os.stat(dest).st_mode) if existed else 0o644
        except OSError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except OSError as exc:
        discard(tmp)
        raise write_error(p, exc, existed) from exc
    except BaseException:
        discard(tmp)
        raise
    sync_folder(dest.parent)
    return p


def make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created, deepest first."""
    made = []
    d = folder
    while not d.exists() and d != d.parent:
        made.append(d)
        d = d.parent
    folder.mkdir(parents=True, exist_ok=True)
    return made


def remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty: the folders a failed write made."""
    for d in folders:
        try:
            d.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            break


def write_file(path: str | os.PathLike, writer: Callable[[Path], object]) -> Path:
    """Write ``path`` whole or not at all: ``writer(tmp)`` fills a temporary file beside it
    (writing it by name, e.g. ``lambda t: df.to_parquet(t)``; it must not take its format from
    the extension, which is ``.tmp``), then :func:`commit`. Missing folders are created (and
    removed again on failure). Returns ``Path(path)``.

    Raises :class:`WriteError` (an ``OSError``) naming ``path`` when the OS refuses a write (a
    full disk: ``cannot write out/x.json: [Errno 28] No space left on device (the old file is
    unchanged)``); anything else ``writer`` raises is raised as it is. Either way the temporary
    file is gone and ``path`` is as it was."""
    p = Path(path)
    existed = p.exists()
    made: list[Path] = []
    try:
        made = make_folders(p.parent)
        tmp = temp_for(p)
    except WriteError:
        remove_empty(made)
        raise
    except OSError as exc:
        remove_empty(made)
        raise write_error(p, exc, existed) from exc
    try:
        writer(tmp)
        return commit(tmp, p)
    except BaseException as exc:
        discard(tmp)
        remove_empty(made)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise write_error(p, exc, existed) from exc
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`write_file`). Returns the path."""
    def fill(t: Path) -> None:
        with open(t, "wb") as f:
            f.write(data)
    return write_file(path, fill)


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (:func:`write_file`), in ``encoding`` with ``\\n``
    line ends. Returns the path."""
    return write_bytes(path, text.encode(encoding))


def append_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Append ``text`` to ``path`` (created if missing, with its folders) as one block: all of it
    or none. The block is written and flushed to the disk (``fsync``); when that fails the file is
    cut back to its old size (a file this call created is removed), so a reader never sees half a
    block. For step summaries (``$GITHUB_STEP_SUMMARY``), which are appended to by several steps.
    Returns the path. Raises :class:`WriteError` naming ``path`` (``... (the old file is
    unchanged)``)."""
    p = Path(path)
    data = text.encode(encoding)
    existed = p.exists()
    made: list[Path] = []
    try:
        made = make_folders(p.parent)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        remove_empty(made)
        raise write_error(p, exc, existed) from exc
    size = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
            os.fsync(fd)
        os.close(fd)
        if not existed:
            discard(p)
            remove_empty(made)
        if isinstance(exc, OSError):
            raise write_error(p, exc, existed) from exc
        raise
    os.close(fd)
    if not existed:
        sync_folder(p.parent)
    return p
