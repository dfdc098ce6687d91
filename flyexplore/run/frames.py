"""Messages between a driver and its worker processes over plain pipes, in frames: an 8-byte
big-endian length, then the message's bytes. Written whole (:func:`send`), read whole or not at all
by a reader that never blocks (:class:`Inbox`): a worker stopped or killed in the middle of a
message leaves a partial frame in the reader, never a driver stuck in a read (``Connection.recv``
has no time limit). Sweep workers (:mod:`flyexplore.run.engine`) send pickles; an environment
A/B's workers (:mod:`flyexplore.run.envworker`) JSON, which crosses Python and torch versions.
No flyexplore import, no torch: a worker of another environment loads it before anything else.
"""
from __future__ import annotations

import os
from typing import Any, Callable

#: Most bytes an :class:`Inbox` reads in one :meth:`Inbox.read` (a chatty worker cannot hold the driver).
MAX_READ = 64 << 20


def send(fd: int, data: bytes) -> None:
    """Write one frame of ``data`` to ``fd``: an 8-byte big-endian length, then ``data``. Blocks
    only while the pipe is full (the reader drains it whenever it is readable)."""
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        view = view[os.write(fd, view):]


def recv(fd: int) -> bytes:
    """Read one frame from ``fd``, blocking (a worker waiting for its next command). Raises
    ``EOFError`` when the other end is closed."""
    n = int.from_bytes(_exactly(fd, 8), "big")
    return _exactly(fd, n)


def _exactly(fd: int, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("the other end closed the pipe")
        buf += chunk
    return bytes(buf)


class Inbox:
    """The messages arriving on pipe ``fd``, read without ever blocking (the fd is made
    non-blocking), each frame decoded by ``decode`` (bytes -> message). :attr:`eof` is set once
    the writer's end is closed."""

    def __init__(self, fd: int, decode: Callable[[bytes], Any]):
        os.set_blocking(fd, False)
        self.fd, self.decode, self.buf, self.eof = fd, decode, bytearray(), False

    def read(self) -> list:
        """The complete messages that have arrived, oldest first (none: ``[]``); at most
        :data:`MAX_READ` bytes are read per call."""
        got = 0
        while not self.eof and got < MAX_READ:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                break
            self.buf += chunk
            got += len(chunk)
        out = []
        while len(self.buf) >= 8:
            n = int.from_bytes(self.buf[:8], "big")
            if len(self.buf) < 8 + n:
                break
            out.append(self.decode(bytes(self.buf[8:8 + n])))
            del self.buf[:8 + n]
        return out
