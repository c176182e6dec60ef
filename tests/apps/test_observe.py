"""The service's observers' helpers (processor/apps/observe.py): the once-per-change unserved warning."""

from __future__ import annotations

from processor.apps.observe import UnservedWatch


def test_an_unserved_model_is_named_once_after_the_grace_and_again_only_after_a_change() -> None:
    watch = UnservedWatch(grace_ms=5_000)
    assert watch.update({"m": (3, 300)}, 0) == []  # contracts may not have been read yet
    assert watch.update({"m": (3, 300)}, 4_999) == []
    assert watch.update({"m": (4, 400)}, 5_000) == [("m", 4, 400)]
    assert watch.update({"m": (9, 900)}, 60_000) == []  # said once, however long it lasts
    assert watch.update({}, 61_000) == []  # served now
    assert watch.update({"m": (1, 10)}, 62_000) == []
    assert watch.update({"m": (1, 10), "n": (2, 20)}, 67_000) == [("m", 1, 10)]
    assert watch.update({"m": (1, 10), "n": (2, 20)}, 72_000) == [("n", 2, 20)]
