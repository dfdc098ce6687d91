"""The one place outputs are written (:mod:`flyexplore.atomic`, issue 33): whole or not at all.
A write that fails midway (the OS's ENOSPC raised by the writer, by ``fsync`` or by ``write``
after part of a block went in) leaves the old file byte for byte, no temporary file and no new
file or folder, and raises one :class:`~flyexplore.errors.WriteError` line naming the file.
In-process and fast; a really full disk for every kind of output: tests/cli/test_full_disk.py."""
import errno
import os

import pytest

from flyexplore import atomic as A
from flyexplore.errors import WriteError

def _full(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_write_replaces_the_file_whole_and_keeps_its_mode(tmp_path):
    p = tmp_path / "out.json"
    p.write_text("old")
    os.chmod(p, 0o640)
    assert A.write_text(p, "new ✓\n") == p
    assert p.read_bytes() == "new ✓\n".encode() and (os.stat(p).st_mode & 0o777) == 0o640
    A.write_text(tmp_path / "a" / "b" / "new.md", "x")
    assert (os.stat(tmp_path / "a" / "b" / "new.md").st_mode & 0o777) == 0o644
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a", "out.json"]   # no temporary file
    link = tmp_path / "a" / "link.json"
    link.symlink_to(p)
    A.write_text(link, "through the link")   # the file it points to is replaced; the link stays
    assert link.is_symlink() and p.read_text() == "through the link"


@pytest.mark.parametrize("where", ["writer", "fsync"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch, where):
    old = tmp_path / "r.csv"
    old.write_bytes(b"a,b\n1,2\n")

    def writer(t):
        t.write_bytes(b"a,b\n3,")   # half written, then the disk is full
        if where == "writer":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(t))
    if where == "fsync":
        monkeypatch.setattr(A.os, "fsync", _full)
    with pytest.raises(WriteError) as e:
        A.write_file(old, writer)
    assert str(e.value) == f"cannot write {old}: [Errno 28] No space left on device (the old file is unchanged)"
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(old) and isinstance(e.value, OSError)
    assert old.read_bytes() == b"a,b\n1,2\n" and [x.name for x in tmp_path.iterdir()] == ["r.csv"]
    new = tmp_path / "made" / "for" / "it.csv"
    with pytest.raises(WriteError, match=r"\(nothing was written\)$"):
        A.write_file(new, writer)
    assert [x.name for x in tmp_path.iterdir()] == ["r.csv"]   # nor the folders made for it


def test_an_interrupt_or_a_writer_bug_leaves_no_temporary_file(tmp_path):
    p = tmp_path / "f.md"
    p.write_text("old")
    for exc in (KeyboardInterrupt, ValueError):
        def writer(t, exc=exc):
            t.write_text("half")
            raise exc()
        with pytest.raises(exc):
            A.write_file(p, writer)
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["f.md"]


def test_an_append_writes_the_whole_block_or_nothing(tmp_path, monkeypatch):
    p = tmp_path / "summary.md"
    A.append_text(p, "## one\n")
    A.append_text(p, "## two\n")
    assert p.read_text() == "## one\n## two\n"
    real, calls = os.write, []

    def torn(fd, data):   # the disk fills 5 bytes into the block
        if fd <= 2:
            return real(fd, data)
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(A.os, "write", torn)
    with pytest.raises(WriteError) as e:
        A.append_text(p, "| a | b |\n|---|---|\n")
    assert str(e.value) == f"cannot write {p}: [Errno 28] No space left on device (the old file is unchanged)"
    assert p.read_text() == "## one\n## two\n" and calls == [20, 15]   # 5 bytes went in, then were cut
    with pytest.raises(WriteError, match=r"\(nothing was written\)$"):
        A.append_text(tmp_path / "new" / "s.md", "| a | b |\n")
    assert [x.name for x in tmp_path.iterdir()] == ["summary.md"]


def test_the_reason_is_the_oss_words_for_its_errno():
    # pyarrow says "Error writing bytes to file. Detail: [errno 28] ..." with errno 28
    e = A.write_error("x.parquet", OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] ..."), True)
    assert str(e) == "cannot write x.parquet: [Errno 28] No space left on device (the old file is unchanged)"
    assert str(A.write_error("a\nb.md", OSError("no errno"), False)) == "cannot write a b.md: no errno (nothing was written)"
