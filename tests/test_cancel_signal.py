"""``ctx.cancelled`` as the pool makes it (``jobdeck.worker.lease.CancelSignal``):
a ``threading.Event`` in every way a handler can use one, whose condition is
made only when something waits on it, sets it or clears it."""

from __future__ import annotations

import threading
import time

from jobdeck.worker.lease import CancelSignal


def test_it_is_an_event_and_starts_unset() -> None:
    signal = CancelSignal()
    assert isinstance(signal, threading.Event)
    assert not signal.is_set()
    assert signal.reason is None
    assert "_made" not in vars(signal)  # no condition until one is needed


def test_a_wait_times_out_unset_and_returns_false() -> None:
    signal = CancelSignal()
    started = time.monotonic()
    assert signal.wait(0.05) is False
    assert time.monotonic() - started >= 0.04


def test_a_cancel_from_another_thread_ends_a_wait_at_once_with_its_reason() -> None:
    signal = CancelSignal()
    waiting = threading.Event()
    woke: list[bool] = []

    def waiter() -> None:
        waiting.set()
        woke.append(signal.wait(30))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(5)
    deadline = time.monotonic() + 5  # until the waiter is inside the condition's wait
    while "_made" not in vars(signal) and time.monotonic() < deadline:
        time.sleep(0.001)
    signal.cancel("timed out")
    thread.join(5)
    assert not thread.is_alive() and woke == [True]
    assert signal.is_set() and signal.reason == "timed out"


def _wait_into(signal: CancelSignal, results: list[bool]) -> None:
    results.append(signal.wait(10))


def test_many_waiters_racing_one_cancel_all_wake() -> None:
    # Waiters that make the condition while the cancel lands: none may miss it.
    for _ in range(50):
        signal = CancelSignal()
        results: list[bool] = []
        threads = [threading.Thread(target=_wait_into, args=(signal, results)) for _ in range(4)]
        for t in threads:
            t.start()
        signal.cancel("cancelled")
        for t in threads:
            t.join(10)
        assert results == [True] * 4


def test_set_before_any_wait_is_seen_and_the_first_reason_is_kept() -> None:
    signal = CancelSignal()
    signal.cancel("lease lost")
    signal.cancel("cancelled")
    assert signal.wait(0) is True and signal.wait() is True
    assert signal.reason == "lease lost"


def test_clear_unsets_it() -> None:
    signal = CancelSignal()
    signal.set()
    signal.clear()
    assert not signal.is_set()
    assert signal.wait(0.01) is False
