"""The call watchdog (processor/kafka/watchdog.py)."""

from __future__ import annotations

# -- the watchdog ------------------------------------------------------------------------------


def test_the_watchdog_reports_a_call_stuck_past_its_limit_once_and_ignores_quick_ones() -> None:
    import time

    from processor.kafka.watchdog import CallWatchdog

    stuck: list[str] = []
    dog = CallWatchdog(0.2, on_stuck=lambda what, _s: stuck.append(what))
    with dog.guard("quick"):
        pass
    with dog.guard("slow commit"):
        time.sleep(0.6)
    time.sleep(0.2)
    assert stuck == ["slow commit"]


def test_a_call_guarded_with_its_own_timeout_is_stuck_past_it_even_inside_a_longer_guard() -> None:
    import time

    from processor.kafka import watchdog
    from processor.kafka.watchdog import CallWatchdog, guarded

    stuck: list[str] = []
    dog = CallWatchdog(30.0, on_stuck=lambda what, _s: stuck.append(what))
    saved = watchdog.PAST_TIMEOUT_S
    watchdog.PAST_TIMEOUT_S = 0.1
    try:
        with dog.guard("the transaction commit"), guarded(dog, "send_offsets_to_transaction", 0.2):
            time.sleep(1.6)  # the watchdog ticks every second at most
    finally:
        watchdog.PAST_TIMEOUT_S = saved
    time.sleep(0.1)
    assert stuck == ["send_offsets_to_transaction"]  # the commit's own 30 s limit has not passed
