"""The in-process executor's store writer: one thread that writes pieces and blocks in the order given.

The thread that drives the network hands each write over (:meth:`BlockWriter.submit`) and goes on
mapping: the zstd compression and the files of block k are written while block k+1 is mapped. One thread
keeps the writes in submission order, so a block's flag still follows its rows and the blocks are flagged
in order. At most :data:`MAX_PENDING` writes wait (their rows are held in memory); a write's error (a
full disk) is raised in the network's thread at its next hand-over, or when the writer is drained, and the
writes handed over after it are skipped.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: writes waiting at most (the oldest is waited for before another is handed over)
MAX_PENDING = 4


class BlockWriter:
    """Runs write functions one after the other in a thread of their own (a context manager that waits for
    every write on leaving: the writes handed over before an error or a Ctrl-C still land on disk)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="features-writer")
        self._pending: deque[Future] = deque()
        self._results: deque[Any] = deque()  # of writes waited for, not yet taken by finished() or drain()
        self._failed = threading.Event()

    def __enter__(self) -> BlockWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        try:
            if kind is None:
                for _ in self.drain():
                    pass
            else:  # the caller's error wins; the writes already handed over still finish
                self.wait_quietly()
        finally:
            self._pool.shutdown(wait=True)

    def submit(self, write: Callable[..., Any], *args: Any) -> None:
        """Hand ``write(*args)`` over; first raise the error of an earlier write, and wait for the oldest
        write while :data:`MAX_PENDING` are waiting."""
        while self._pending and (self._pending[0].done() or len(self._pending) >= MAX_PENDING):
            self._results.append(self._pending.popleft().result())
        self._pending.append(self._pool.submit(self._in_order, write, *args))

    def _in_order(self, write: Callable[..., Any], *args: Any) -> Any:
        """``write(*args)`` unless an earlier write failed (a block after a failed one is never flagged)."""
        if self._failed.is_set():
            return None
        try:
            return write(*args)
        except BaseException:
            self._failed.set()
            raise

    def finished(self) -> Iterator[Any]:
        """The results of the oldest writes already done, in order (an error is raised here)."""
        while self._pending and self._pending[0].done():
            self._results.append(self._pending.popleft().result())
        while self._results:
            yield self._results.popleft()

    def drain(self) -> Iterator[Any]:
        """Wait for every write, yielding each result in order (the first error is raised)."""
        while self._pending:
            self._results.append(self._pending.popleft().result())
        while self._results:
            yield self._results.popleft()

    def wait_quietly(self) -> None:
        """Wait for every write handed over, ignoring their errors (another error is being raised)."""
        while self._pending:
            with contextlib.suppress(Exception):
                self._pending[0].result()
            self._pending.popleft()
