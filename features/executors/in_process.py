"""The in-process executor: the blocks one after the other in this process, in three threads.

A reader thread decodes the next ``read_ahead`` blocks (each in ``decode_threads`` threads, which also do the
mapper's host part); this thread only sends pixels to the network and collects rows, a call of the mapper
at a time (:func:`features.executors.mapping.map_block`); a writer thread writes the rows, so block k's
compression and files overlap the mapping of block k+1 (:class:`features.executors.writer.BlockWriter`,
in order: a block's flag still follows its rows).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from features.executors.block import BlockResult, BlockTask, LoadedBlock, MapperFactory, host_part, read_block
from features.executors.extract import cached_mapper
from features.executors.mapping import map_block
from features.executors.writer import BlockWriter
from vsecore.errors import UserError


class InProcessExecutor:
    """Runs the blocks one after the other in this process: reading ahead, mapping, writing behind.

    ``decode_threads``: threads decoding a block's images (``None``: the CPU count, or the task's);
    ``read_ahead``: blocks decoded ahead of the one being mapped (each held in memory meanwhile).
    """

    def __init__(self, decode_threads: int | None = None, read_ahead: int = 1) -> None:
        if read_ahead < 1:
            raise UserError(f"--read-ahead must be at least 1, not {read_ahead}")
        self.decode_threads, self.read_ahead = decode_threads, read_ahead

    def run(self, tasks: Sequence[BlockTask], factory: MapperFactory,
            progress: Callable[[int], Any] | None = None) -> Iterator[BlockResult]:
        """Yield each block's result in block order, once its flag is written.

        A bad image under ``--on-error fail`` (raised by the reader) still surfaces only after every earlier
        block is written: the writer finishes what it was handed before the error leaves.
        """
        mapper = cached_mapper(factory)
        load, prepare = host_part(mapper)
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="features-reader")
        ahead: deque[Future[LoadedBlock]] = deque()

        def read(k: int) -> None:
            if k < len(tasks):
                ahead.append(reader.submit(read_block, tasks[k], load, self.decode_threads, prepare))

        try:
            with BlockWriter() as writer:
                for k in range(self.read_ahead):
                    read(k)
                for k in range(len(tasks)):
                    block = ahead.popleft().result()
                    read(k + self.read_ahead)
                    yield from (r for r in writer.finished() if r is not None)
                    map_block(block, mapper, writer.submit, progress)
                yield from (r for r in writer.drain() if r is not None)
        finally:
            reader.shutdown(wait=True, cancel_futures=True)
