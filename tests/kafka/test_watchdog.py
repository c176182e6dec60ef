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
