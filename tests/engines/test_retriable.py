"""Which engine failures are worth another try (processor/engines/base.py, ``retriable_error``): the
consumer app marks a batch's completions ``retriable`` when its engine raised one of these."""

from __future__ import annotations

import urllib.error

from processor.engines.base import retriable_error


def test_timeouts_and_connection_errors_are_retriable_whatever_wraps_them() -> None:
    assert retriable_error(TimeoutError("slow"))
    assert retriable_error(ConnectionRefusedError(111, "refused"))
    assert retriable_error(urllib.error.URLError(ConnectionRefusedError(111, "refused")))
    try:
        try:
            raise ConnectionResetError("gone")
        except ConnectionResetError as exc:
            raise RuntimeError("batch failed") from exc
    except RuntimeError as wrapped:
        assert retriable_error(wrapped)


def test_other_errors_are_not() -> None:
    assert not retriable_error(ValueError("bad prompt"))
    assert not retriable_error(RuntimeError("out of memory"))
    assert not retriable_error(urllib.error.URLError("unknown url type"))
