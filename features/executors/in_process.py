"""The in-process executor: the blocks one after the other in this process, the next block decoded while
the network maps the current one."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from features.executors.extract import (
    BlockResult,
    BlockTask,
    MapperFactory,
    cached_mapper,
    map_and_write,
    read_block,
)


class InProcessExecutor:
    """Runs the blocks one after the other in this process, decoding the next block meanwhile."""

    def run(self, tasks: Sequence[BlockTask], factory: MapperFactory) -> Iterator[BlockResult]:
        """Yield each block's result in block order.

        A reader thread decodes block k+1 while the network maps block k (the GPU does not wait
        for JPEG decoding); a bad image under ``--on-error fail`` still surfaces only after
        every earlier block is written.
        """
        mapper = cached_mapper(factory)
        # the decode threads also do the mapper's host part (the resize): this thread only drives the network
        prepare = getattr(mapper, "prepare", None)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="features-reader") as reader:
            ahead = reader.submit(read_block, tasks[0], prepare=prepare) if tasks else None
            for k in range(len(tasks)):
                block = ahead.result()
                if k + 1 < len(tasks):
                    ahead = reader.submit(read_block, tasks[k + 1], prepare=prepare)
                yield map_and_write(block, mapper)
