"""Reading ahead on a thread: the items come in order, an error after the items before it, at
most `depth` made ahead of the one taken; a caller that stops early stops the thread and the
source is closed (its files) on that thread."""

from __future__ import annotations

import threading
import time

import pytest

from gpt.data.ahead import ahead


def test_the_items_come_in_order_made_on_another_thread():
    threads = []

    def items():
        for i in range(100):
            threads.append(threading.current_thread())
            yield i

    assert list(ahead(items(), depth=3)) == list(range(100))
    assert set(threads) == {threads[0]} and threads[0] is not threading.current_thread()


def test_an_error_is_raised_after_the_items_before_it():
    def items():
        yield from (1, 2)
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item in ahead(items()):
            got.append(item)
    assert got == [1, 2]


@pytest.mark.parametrize("depth", [1, 4])
def test_at_most_depth_items_are_made_ahead(depth):
    made = []

    def items():
        for i in range(50):
            made.append(i)
            yield i

    it = ahead(items(), depth=depth)
    assert next(it) == 0
    # beyond the one taken: `depth` queued and one made, waiting for room
    deadline = time.monotonic() + 10
    while len(made) < depth + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # room for it to run further, were it not bounded
    assert len(made) == depth + 2
    it.close()


def test_a_caller_that_stops_early_stops_the_thread_and_closes_the_source():
    closed = threading.Event()
    closed_on = []

    def items():
        try:
            yield from range(10**9)
        finally:
            closed_on.append(threading.current_thread().name)
            closed.set()

    before = threading.active_count()
    it = ahead(items(), depth=2)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    it.close()
    assert closed.is_set() and closed_on == ["read-ahead"]
    assert threading.active_count() == before
