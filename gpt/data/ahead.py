"""Reading ahead: an iterator's items made on a thread of their own, a few at a time.

Before a corpus is tokenized, its files are read one record after another on one thread, with
the other cores idle (tokenizing needs the whole cleaned text: its split and vocabulary depend on
its length). pyarrow decodes Parquet pages without the GIL, so a reading thread decodes the next
batch while this thread cleans the one before (the Parquet front at 250 MB: 1.3-1.4 s against
1.6-1.8 s). Decompressing does not gain so: python-zstandard holds the GIL, and gzip's reader
takes it back every 8 KB (docs/performance.md).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_END = object()  # the items ran out


def ahead(items: Iterable[T], depth: int = 4) -> Iterator[T]:
    """The items of `items`, in order, made on another thread at most `depth` ahead of the
    one taken (memory: `depth` items). An exception raised making an item is raised here, after
    the items before it. When the caller stops early (an error, a generator closed), the
    thread stops after the item it is making and closes `items` (its files) there."""
    made: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(depth)
    stop = threading.Event()

    def make() -> None:
        it = iter(items)
        try:
            for item in it:
                if not _put(made, (item, None), stop):
                    return
            _put(made, (_END, None), stop)
        except BaseException as e:  # handed to the caller's thread, raised there
            _put(made, (_END, e), stop)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=make, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = made.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while True:  # room for the thread's last put, should it be waiting for some
            try:
                made.get_nowait()
            except queue.Empty:
                break
        thread.join()


def _put(made: queue.Queue, entry: tuple[object, BaseException | None],
         stop: threading.Event) -> bool:
    """Put `entry`, unless the caller stopped taking items (then False)."""
    if stop.is_set():
        return False
    made.put(entry)  # the caller empties the queue when it stops: this never waits forever
    return True
