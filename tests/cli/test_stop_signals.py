"""A stop signal never deadlocks the command it stops.

Python runs a signal handler on the main thread between two bytecodes, possibly while that thread
holds the stop event's lock inside ``stop.wait()``; a handler that calls ``stop.set()`` itself then
waits for that lock for ever (``tokenfabric status --watch`` hung on SIGINT in a CI rehearsal). Each
test holds the lock on one thread and runs the handler there, as the interpreter would.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator

import pytest

from processor.cli.options import install_stop_handlers
from processor.cli.serve import stop_on_signals


@pytest.fixture(autouse=True)
def _handlers_put_back() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def handler_under_the_events_lock(stop: threading.Event) -> bool:
    """Run the installed SIGINT handler on a thread that holds ``stop``'s lock, as ``stop.wait()``
    does; True when it returned (a deadlocked one never does: its thread is a daemon)."""
    handler = signal.getsignal(signal.SIGINT)
    assert callable(handler)
    returned = threading.Event()

    def main_thread_in_wait() -> None:
        with stop._cond:  # type: ignore[attr-defined]  # where Event.wait holds it
            handler(signal.SIGINT, None)
            returned.set()

    threading.Thread(target=main_thread_in_wait, daemon=True).start()
    return returned.wait(5)


@pytest.mark.parametrize(
    "install",
    [
        lambda stop: install_stop_handlers(stop, announce=lambda _sig: None),
        stop_on_signals,
    ],
    ids=["install_stop_handlers", "stop_on_signals"],
)
def test_a_stop_signal_under_the_events_lock_returns_and_the_event_is_set(
    install: Callable[[threading.Event], None],
) -> None:
    stop = threading.Event()
    install(stop)
    assert handler_under_the_events_lock(stop), "the handler waited for the lock its own thread holds"
    assert stop.wait(5)


def test_a_second_signal_aborts_at_once() -> None:
    stop = threading.Event()
    install_stop_handlers(stop, announce=lambda _sig: None)
    handler = signal.getsignal(signal.SIGINT)
    assert callable(handler)
    handler(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGTERM, None)
