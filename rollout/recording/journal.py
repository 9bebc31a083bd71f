"""All-or-nothing updates of a file written in place (HDF5) through a rollback journal.

Why: HDF5 updates metadata in place (B-tree nodes, heaps, object headers, the
superblock), so a process killed inside h5py while a file is open for writing
can leave *earlier* demos unreachable. Reopening the file per episode narrows
that window but does not close it; SWMR cannot create groups; copying the file
per episode costs its whole size every episode.

How: the writer (h5py, through its ``fileobj`` driver) gets a :class:`PagedFile`
that never changes a committed byte before the commit, the way SQLite's
rollback journal works:

* ``S`` is the file size when the update starts. Writes below ``S`` (rounded up
  to a 4 KiB page) land in an in-memory page overlay; writes past it (new space,
  where HDF5 puts all new data: the images) are kept in memory and written at
  the commit in one call (or, past :data:`TAIL_MAX`, as they come).
* ``<file>-journal`` records ``S`` when the update starts. At commit it gets the
  old bytes of every overlaid page (fsync); then the pages and the new space are
  written and the file fsync'ed. Emptying the journal (truncating it to zero
  bytes, fsync) is the commit point.
* Recovery puts the journaled bytes back and truncates to ``S``: a writer does
  it before its own update (:func:`recover`), readers do it in memory
  (:func:`committed_view`) and never modify the file. An empty journal is no
  update: a writer keeps it from one update to the next (creating a file costs
  a few hundred microseconds on ext4, more than the rest of a commit's journal
  work) and deletes it when it closes; one a killed writer left is deleted by
  the next writer or :func:`recover`.

So a crash, SIGKILL, SIGINT or full disk at any moment leaves the file as of
the last commit. Cost per update: the touched metadata pages twice (journal,
then file) and three fsyncs. One writer per file: a second is refused while the
first holds the journal's ``flock`` (during an update). Readers hold a shared ``flock`` on the file
while they read; a commit takes it exclusively for its few milliseconds. A
program holding the file open with HDF5's own locking (h5py's default) makes a
commit wait up to ``lock_timeout_s`` and then fail; a program that opens the
file with locking off while a killed writer's journal is still pending may see
a half-applied commit, so run :func:`recover` (or resume the run) first.

Single-threaded. Knows nothing of HDF5 or episodes: imports only ``kernels.files`` and
``deflate``'s CRC-32.
"""

from __future__ import annotations

import _signal  # signal's C half: the same calls without signal's enum conversions (~8 us a call less)
import fcntl
import os
import signal
import struct
import threading
import time
import weakref

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rollcap.kernels.files import fsync_dir
from rollcap.rollout.recording.deflate import crc32  # ISA-L's when installed: CRC-32 ~4x faster than zlib's

PAGE = 4096
TAIL_MAX = 8 << 20
"""New space is kept in memory up to this many bytes (written at the commit in one call), then written out."""
_DISK, _TAIL = -1, -2  # where a span lives when not in an overlaid page (see PagedFile._spans)
_HEAD = struct.Struct("<8sQI")  # magic, committed size S, crc32 of the first 16 bytes
_REC = struct.Struct("<QQ")  # offset, length (then the old bytes)
_FOOT = struct.Struct("<8sQI")  # magic, record count, crc32 of the record bytes
_HEAD_MAGIC, _FOOT_MAGIC = b"RCJHEAD1", b"RCJFOOT1"


def journal_path(path) -> Path:
    """Where ``path``'s journal lives while a writer has the file (empty between its updates), or after a crash."""
    return Path(f"{path}-journal")


def pending_journal(path) -> bool:
    """Whether ``path``'s journal holds an update that has not committed (under way, or a killed writer's): what
    :func:`recover` rolls back. An empty journal (a writer's between updates, or left by a killed one) holds none."""
    try:
        return journal_path(path).stat().st_size > 0
    except FileNotFoundError:
        return False


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _pwritev_all(fd: int, parts: list, offset: int) -> None:
    """``parts`` one after the other from ``offset``, in one call when it writes them all (it may write fewer)."""
    done = os.pwritev(fd, parts, offset)
    if done < sum(len(q) for q in parts):
        _pwrite_all(fd, b"".join(parts)[done:], offset + done)


def _parse(raw: bytes) -> tuple[int | None, list[tuple[int, bytes]]]:
    """``(S, old-byte records)``; ``S`` None for a torn header; records empty unless the footer checks out."""
    if len(raw) < _HEAD.size:
        return None, []
    magic, base, crc = _HEAD.unpack_from(raw)
    if magic != _HEAD_MAGIC or crc != crc32(raw[:16]):
        return None, []
    body_end = len(raw) - _FOOT.size
    if body_end < _HEAD.size:
        return base, []
    magic, count, crc = _FOOT.unpack_from(raw, body_end)
    body = raw[_HEAD.size : body_end]
    if magic != _FOOT_MAGIC or crc != crc32(body):
        return base, []  # the commit never got as far as changing the file
    recs, pos = [], 0
    while pos < len(body):
        off, n = _REC.unpack_from(body, pos)
        recs.append((off, body[pos + _REC.size : pos + _REC.size + n]))
        pos += _REC.size + n
    return base, recs if len(recs) == count else []


def _flock(fd: int, op: int, timeout_s: float, path) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{path}: still locked by another process after {timeout_s:.0f} s "
                    "(a program holding it open with HDF5 file locking?); close it and retry"
                ) from None
            time.sleep(0.005)


class PagedFile:
    """File-like object over ``fd`` (seek, tell, read, readinto, write, truncate, flush).

    Bytes below ``bound`` (``base`` rounded up to a page) live in an overlay of
    pages once touched; the disk keeps the committed bytes there until
    :meth:`commit`. New space past ``bound`` (where HDF5 puts everything new)
    is a tail in memory, written in one call at the commit (or whenever it
    reaches :data:`TAIL_MAX`, so a long update does not hold it all), instead
    of one system call for each of HDF5's small writes. A read-only view patched
    with journaled old bytes shows the last committed state. No method raises:
    the first error lands in :attr:`error` and later writes do nothing (as after
    :meth:`discard`).
    """

    def __init__(self, fd: int, base: int, writable: bool = False, journal: int | None = None):
        self._writable, self._pos = writable, 0
        self.stale = False
        """Set by a read or write between updates (see :meth:`park`): whoever holds the file open must reopen it."""
        self._begin(fd, base, journal)

    def _begin(self, fd: int, base: int, journal: int | None = None) -> None:
        """Start an update over ``fd``, whose committed size is ``base`` (the same object, for a library that keeps
        it open from one update to the next). ``journal``: its header (``base``) is fsync'ed before new space first
        reaches the disk ahead of the commit, so recovery can cut it off."""
        self._fd, self._base, self._journal = fd, base, journal
        self._bound = -(-base // PAGE) * PAGE
        self._pages: dict[int, bytearray] = {}
        self._committed: dict[int, bytes] = {}  # each overlaid page's bytes on disk when it was first touched
        self._size, self._dead, self._parked = base, False, False
        self._tail = bytearray()  # the bytes from ``_tail_at`` on; disk between ``_bound`` and ``_tail_at``
        self._tail_at = self._bound if self._writable else 1 << 62
        self._old: list[tuple[int, bytes]] = []
        self.error: BaseException | None = None
        """The first exception inside a read / write / truncate; the caller re-raises it."""

    def park(self) -> None:
        """After a commit, until the next update: no I/O reaches the file; any read or write marks :attr:`stale`
        (whoever made it, e.g. h5py closing the file at exit, holds state the file does not have)."""
        self._fd, self._dead, self._parked, self._pages, self._committed, self._old = -1, True, True, {}, {}, []
        self._tail, self._journal = bytearray(), None

    def _page(self, p: int) -> bytearray:
        page = self._pages.get(p)
        if page is None:
            page = bytearray(PAGE)
            data = os.pread(self._fd, PAGE, p * PAGE)
            page[: len(data)] = data
            self._pages[p] = page
            self._committed[p] = data  # what the journal will keep of it (the disk's bytes: below ``base``)
        return page

    def _spans(self, start: int, end: int) -> Iterator[tuple[int, int, int]]:
        """Split ``[start, end)`` into ``(lo, hi, where)``: a page index, :data:`_DISK` or :data:`_TAIL`."""
        while start < end:
            if start >= self._tail_at:
                yield start, end, _TAIL
                return
            if start >= self._bound:
                hi = min(end, self._tail_at)
                yield start, hi, _DISK
            else:
                hi = min((start // PAGE + 1) * PAGE, end)
                yield start, hi, start // PAGE
            start = hi

    def _to_tail(self, at: int, data) -> None:
        """Write ``data`` at file offset ``at`` (past ``_tail_at``) into the tail; spill a full tail to disk."""
        tail, lo = self._tail, at - self._tail_at
        if lo > len(tail):  # a hole: zeros, as the disk would read
            tail.extend(bytes(lo - len(tail)))
        tail[lo : lo + len(data)] = data
        if len(tail) >= TAIL_MAX:
            if self._journal is not None:
                os.fsync(self._journal)
                self._journal = None
            _pwrite_all(self._fd, tail, self._tail_at)
            self._tail_at += len(tail)
            self._tail = bytearray()

    def patch(self, offset: int, data: bytes) -> None:
        """Overlay ``data`` at ``offset`` (journaled old bytes, for a read-only view)."""
        for lo, hi, p in self._spans(offset, offset + len(data)):
            self._page(p)[lo - p * PAGE : hi - p * PAGE] = data[lo - offset : hi - offset]

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if not whence else offset + (self._pos if whence == 1 else self._size)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        """Nothing: durability is :meth:`commit`'s job."""

    def _fail(self, err: BaseException) -> None:
        """Remember the first error and stop writing; never raise into h5py (its fileobj driver crashes on that)."""
        self.error = self.error or err
        self._dead = True
        self.stale = self.stale or self._parked

    def read(self, n: int = -1) -> bytes:
        buf = bytearray(max(0, self._size - self._pos) if n is None or n < 0 else n)
        return bytes(buf[: self.readinto(buf)])

    def readinto(self, buf) -> int:
        out = memoryview(buf).cast("B")
        start, end = self._pos, min(self._pos + len(out), self._size)
        try:
            for lo, hi, p in self._spans(start, end):
                if p in self._pages:
                    out[lo - start : hi - start] = self._pages[p][lo - p * PAGE : hi - p * PAGE]
                elif p == _TAIL:
                    got = self._tail[lo - self._tail_at : hi - self._tail_at]
                    out[lo - start : lo - start + len(got)] = got
                    out[lo - start + len(got) : hi - start] = bytes(hi - lo - len(got))
                else:
                    data = os.pread(self._fd, hi - lo, lo)
                    out[lo - start : lo - start + len(data)] = data
                    out[lo - start + len(data) : hi - start] = bytes(hi - lo - len(data))
        except BaseException as err:  # noqa: BLE001 - reported through self.error
            self._fail(err)
        self._pos = max(start, end)
        return max(0, end - start)

    def write(self, buf) -> int:
        data = memoryview(buf).cast("B")
        try:
            if not self._writable:
                raise OSError("read-only view")
            start = self._pos
            if not data:  # h5py's driver writes nothing often (most of its calls at a close)
                return 0
            self.stale = self.stale or self._parked
            if start >= self._tail_at and not self._dead:  # new space: the common case
                self._to_tail(start, data)
            elif not self._dead:
                for lo, hi, p in self._spans(start, start + len(data)):
                    if p == _TAIL:
                        self._to_tail(lo, data[lo - start :])
                    elif p == _DISK:
                        _pwrite_all(self._fd, data[lo - start : hi - start], lo)
                    else:
                        self._page(p)[lo - p * PAGE : hi - p * PAGE] = data[lo - start : hi - start]
            self._pos = start + len(data)
            self._size = max(self._size, self._pos)
        except BaseException as err:  # noqa: BLE001 - reported through self.error
            self._fail(err)
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        try:
            if not self._writable:
                raise OSError("read-only view")
            if self._dead:
                self.stale = self.stale or (self._parked and size != self._size)
            elif size >= self._tail_at:
                del self._tail[size - self._tail_at :]
            elif size >= self._bound:
                os.ftruncate(self._fd, size)
                self._tail, self._tail_at = bytearray(), size
            else:  # the committed bytes stay on disk; the cut is zeroed in the overlay
                if os.fstat(self._fd).st_size > self._bound:
                    os.ftruncate(self._fd, self._bound)
                self._tail, self._tail_at = bytearray(), self._bound
                for p in range(size // PAGE, self._bound // PAGE):
                    cut = max(size - p * PAGE, 0)
                    self._page(p)[cut:] = bytes(PAGE - cut)
            self._size = size
        except BaseException as err:  # noqa: BLE001 - reported through self.error
            self._fail(err)
        return size

    def commit(self, jfd: int) -> None:
        """Journal the old bytes of every overlaid page, then write the pages and the tail; call under an exclusive
        flock. Runs of adjacent pages are read and written in one call each."""
        runs: list[list[int]] = []
        for p in sorted(self._pages):
            if runs and runs[-1][-1] == p - 1:
                runs[-1].append(p)
            else:
                runs.append([p])
        self._old = [(r[0] * PAGE, b"".join(self._committed[p] for p in r)[: self._base - r[0] * PAGE]) for r in runs]
        body = b"".join(_REC.pack(off, len(old)) + old for off, old in self._old)
        _pwrite_all(jfd, body + _FOOT.pack(_FOOT_MAGIC, len(self._old), crc32(body)), _HEAD.size)
        os.fsync(jfd)
        for r in runs:
            parts = [memoryview(self._pages[p])[: min(PAGE, self._size - p * PAGE)] for p in r if p * PAGE < self._size]
            if parts:
                _pwritev_all(self._fd, parts, r[0] * PAGE)
        if self._tail:
            _pwrite_all(self._fd, self._tail[: max(0, self._size - self._tail_at)], self._tail_at)
        os.ftruncate(self._fd, self._size)
        os.fsync(self._fd)

    def discard(self) -> None:
        """Put the committed state back on disk (old bytes, size ``base``); later writes do nothing."""
        self._dead, self._tail = True, bytearray()
        for off, old in self._old:
            _pwrite_all(self._fd, old, off)
        os.ftruncate(self._fd, self._base)
        os.fsync(self._fd)


def _rollback(path: Path, fd: int, jfd: int, lock_timeout_s: float) -> bool:
    """Put back what the journal ``jfd`` (locked) holds of an update that never committed, then empty it; True if
    it held one (an empty or torn journal: nothing reached the file)."""
    size = os.fstat(jfd).st_size
    if not size:
        return False
    base, recs = _parse(os.pread(jfd, size, 0))
    if base is not None:
        _flock(fd, fcntl.LOCK_EX, lock_timeout_s, path)
        try:
            for off, old in recs:
                _pwrite_all(fd, old, off)
            os.ftruncate(fd, base)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    os.ftruncate(jfd, 0)
    os.fsync(jfd)
    return base is not None


def _lock(jfd: int, path: Path) -> None:
    """Take ``jfd``'s exclusive flock, or refuse: another writer holds it."""
    try:
        fcntl.flock(jfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RuntimeError(
            f"{path}: another process is writing it ({journal_path(path)} is locked); one writer per file"
        ) from None


def _is_at(jfd: int, jpath: Path) -> bool:
    """Whether ``jfd`` is still the file at ``jpath`` (a recovery elsewhere may have deleted it)."""
    try:
        return os.stat(jpath).st_ino == os.fstat(jfd).st_ino
    except FileNotFoundError:
        return False


def _recover(path: Path, fd: int, lock_timeout_s: float) -> bool:
    jpath = journal_path(path)
    try:
        jfd = os.open(jpath, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        _lock(jfd, path)
        if not _is_at(jfd, jpath):
            return False
        rolled = _rollback(path, fd, jfd, lock_timeout_s)
        os.unlink(jpath)
        fsync_dir(path.parent)
        return rolled
    finally:
        os.close(jfd)


def recover(path, lock_timeout_s: float = 60.0) -> bool:
    """Roll ``path`` back to its last commit if a killed writer left a pending journal; True if it did. Deletes the
    journal (an empty one too).

    Raises:
        RuntimeError: a live writer holds the journal.
    """
    fd = os.open(path, os.O_RDWR)
    try:
        return _recover(Path(path), fd, lock_timeout_s)
    finally:
        os.close(fd)


_HELD = (int(signal.SIGINT), int(signal.SIGTERM))


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold Python-level SIGINT / SIGTERM handlers (Ctrl-C) until the block ends, then run them.

    h5py cannot unwind an exception raised inside its I/O callbacks, and a begin,
    commit or rollback must not be split. Python runs handlers in the main thread
    only, so elsewhere there is nothing to hold.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    held = {sig: h for sig in _HELD if callable(h := _signal.getsignal(sig))}
    for sig in held:
        _signal.signal(sig, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        for sig, handler in held.items():
            _signal.signal(sig, handler)
        for signum, frame in caught[:1]:
            held[signum](signum, frame)  # e.g. raises KeyboardInterrupt now


class JournaledFile:
    """All-or-nothing updates of ``path`` (one writer's), each through :meth:`update`; :meth:`close` when done.

    The journal file is kept (empty) from one update to the next and deleted by :meth:`close`. Consecutive updates
    get the same :class:`PagedFile` while nothing else has changed the file since this object's last commit (same
    inode, size and times; same process), so a library can keep the file open from one update to the next and its
    caches stay warm: h5py keeps an HDF5 file open this way, which saves reopening it and reading its B-trees again
    at every update. Otherwise (the first update, after a failed one, another writer's commit, a read or write
    between updates, a fork) the update gets a new view and whatever was open over the old one must be dropped: the
    old view is parked, so nothing it is given reaches the file.
    """

    def __init__(self, path, lock_timeout_s: float = 60.0):
        self.path, self._timeout = Path(path), lock_timeout_s
        self._jpath = journal_path(self.path)
        self._view: PagedFile | None = None
        self._stamp: tuple | None = None  # the file as this object's last commit left it
        self._jfd: int | None = None  # the journal, empty between updates
        self._jpid = 0  # the process that opened it
        self._closer: weakref.finalize | None = None

    @staticmethod
    def _stamp_of(fd: int) -> tuple:
        st = os.fstat(fd)
        return os.getpid(), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def _journal(self) -> int:
        """The journal, exclusively locked: the one kept from the last update while it is still the file at its path,
        else opened, or created (and its directory entry made durable).

        Raises:
            RuntimeError: another writer holds it.
        """
        jpath = self._jpath
        for _ in range(100):
            jfd = self._forget_journal()
            if jfd is None:
                try:
                    jfd = os.open(jpath, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    fsync_dir(self.path.parent)
                except FileExistsError:  # left by a killed writer, or another writer's
                    try:
                        jfd = os.open(jpath, os.O_RDWR)
                    except FileNotFoundError:
                        continue
            try:
                _lock(jfd, self.path)
            except BaseException:
                os.close(jfd)
                raise
            if _is_at(jfd, jpath):
                self._jfd, self._jpid, self._closer = jfd, os.getpid(), weakref.finalize(self, os.close, jfd)
                return jfd
            os.close(jfd)  # deleted meanwhile by a recovery elsewhere: take the one at the path
        raise RuntimeError(f"{self.path}: its journal {jpath} keeps being replaced; one writer per file")

    def _forget_journal(self) -> int | None:
        """Take the kept journal's fd (None: none kept). A forked child does not take its parent's: the two would
        share one open file, and so one flock, and could both write; it closes its copy and opens its own."""
        jfd, closer, self._jfd, self._closer = self._jfd, self._closer, None, None
        if closer is not None:
            closer.detach()
        if jfd is not None and self._jpid != os.getpid():
            os.close(jfd)
            return None
        return jfd

    def update(self, update: Callable[[PagedFile], None]) -> PagedFile:
        """Call ``update(file)`` with a writable :class:`PagedFile` over ``path``; all its writes land, or none.
        Returns that file, parked (see :class:`JournaledFile` for when the next update gets it again).

        ``update`` must leave nothing unwritten when it returns (h5py: the file closed, or flushed if kept open).
        If it fails, or a write fails (a full disk), the file is rolled back and the error re-raised. Ctrl-C
        (SIGINT, and SIGTERM if it has a Python handler) is held until the update is committed or rolled back,
        except while waiting for readers' locks.

        Raises:
            RuntimeError: another writer holds the journal.
        """
        path = self.path
        fd = os.open(path, os.O_RDWR)
        kept, self._view = self._view, None
        view: PagedFile | None = None
        jfd: int | None = None
        began = committed = False
        try:
            try:
                with _signals_deferred():
                    jfd = self._journal()
                    if _rollback(path, fd, jfd, self._timeout):  # a killed writer's update
                        kept = None
                    base = os.fstat(fd).st_size
                    head = _HEAD.pack(_HEAD_MAGIC, base, crc32(struct.pack("<8sQ", _HEAD_MAGIC, base)))
                    _pwrite_all(jfd, head, 0)
                    began = True
                    if kept is not None and not kept.stale and self._stamp == self._stamp_of(fd):
                        view = kept
                        view._begin(fd, base, jfd)
                    else:
                        view = PagedFile(fd, base, writable=True, journal=jfd)
                    update(view)
                    if view.error is not None:
                        raise view.error
                _flock(fd, fcntl.LOCK_EX, self._timeout, path)  # interruptible
                try:
                    with _signals_deferred():
                        view.commit(jfd)
                        os.ftruncate(jfd, 0)  # the commit point
                        os.fsync(jfd)
                        committed = True
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except BaseException:
                if began and not committed:
                    with _signals_deferred():
                        if view is not None:
                            view.discard()
                        os.ftruncate(jfd, 0)
                        os.fsync(jfd)
                raise
            finally:
                if jfd is not None:
                    fcntl.flock(jfd, fcntl.LOCK_UN)
                if view is not None:
                    view.park()
            self._view, self._stamp = view, self._stamp_of(fd)
            return view
        finally:
            os.close(fd)

    def close(self) -> None:
        """Delete the (empty) journal unless another writer holds it now; later updates open it again."""
        jfd = self._forget_journal()
        if jfd is None:
            return
        try:
            fcntl.flock(jfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            jpath = self._jpath
            if _is_at(jfd, jpath) and not os.fstat(jfd).st_size:
                os.unlink(jpath)
                fsync_dir(self.path.parent)
        except BlockingIOError:
            pass
        finally:
            os.close(jfd)


@contextmanager
def committed_view(path, lock_timeout_s: float = 60.0) -> Iterator[PagedFile]:
    """A read-only :class:`PagedFile` of ``path`` as of its last commit, under a shared flock.

    A pending journal (a writer mid-update, or a killed one) is rolled back in memory.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        _flock(fd, fcntl.LOCK_SH, lock_timeout_s, path)
        try:
            try:
                base, recs = _parse(journal_path(path).read_bytes())
            except FileNotFoundError:
                base, recs = None, []
            view = PagedFile(fd, os.fstat(fd).st_size if base is None else base)
            for off, old in recs:
                view.patch(off, old)
            yield view
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
