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
#: The longest frame a reader accepts, bytes: far above any real message (a row with its samples is
#: kilobytes; a sweep worker's largest, a case's saved outputs, stays under a few hundred MB), so a
#: length above it is bytes that are no frame -- a worker (or a program posing as one) writing text
#: to the pipe -- and :class:`Garbage`, said at once instead of waited for.
MAX_FRAME = 1 << 32
#: How many of the first bytes of garbage a :class:`Garbage` error quotes.
GARBAGE_BYTES = 60


class Garbage(ValueError):
    """Bytes on a worker's pipe that are no frame (a length past :data:`MAX_FRAME`) or no message
    (its decoder raised): ``head`` holds the first :data:`GARBAGE_BYTES` of them, and the text
    quotes them (``sent garbage on its pipe (not a message): b'Hello world...'``)."""

    def __init__(self, head: bytes, why: str):
        self.head = bytes(head[:GARBAGE_BYTES])
        more = "..." if len(head) > GARBAGE_BYTES else ""
        super().__init__(f"sent garbage on its pipe ({why}): {self.head!r}{more}")


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
        self.bad: Garbage | None = None

    def read(self) -> list:
        """The complete messages that have arrived, oldest first (none: ``[]``); at most
        :data:`MAX_READ` bytes are read per call. Raises :class:`Garbage` for bytes that are no
        frame or no message (the rest of the pipe is then moot: the sender is not a worker); the
        messages that came whole before it are returned first, and the next call raises."""
        if self.bad is not None:
            raise self.bad
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
            if n > MAX_FRAME:
                self.bad = Garbage(bytes(self.buf[:GARBAGE_BYTES + 1]), f"a frame length of {n} bytes")
                break
            if len(self.buf) < 8 + n:
                break
            body = bytes(self.buf[8:8 + n])
            try:
                msg = self.decode(body)
            except Exception as exc:  # noqa: BLE001 - any decoder's failure is the same fault
                self.bad = Garbage(bytes(self.buf[:GARBAGE_BYTES + 1]), f"not a message: {type(exc).__name__}")
                break
            out.append(msg)
            del self.buf[:8 + n]
        if self.bad is not None and not out:
            raise self.bad
        return out
