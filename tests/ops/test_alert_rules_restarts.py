"""The shipped alert rules through a restart of every processor, under ``promtool test rules``: a
restarted processor's counters count from 0 (docs/metrics.md, "Counters across restarts"), so a
restored total never reads as new dead letters, and ``TokenfabricWorkNobodyServes`` is judged on
the waiting items' age, which a restarted processor restores, so its clock does not start again.

The pipeline's series are tests/ops/test_alert_rules.py's (two processors, a and b, and a consumer on
a 15 s scrape); both processors restart at ``RESTART``: their series go stale for a scrape, and come
back from the new processes.
"""

from __future__ import annotations

from pathlib import Path

from tests.ops.test_alert_rules import END, STEP_S, UNSERVED_AGE, Pipeline, expect, minutes, run_rule_tests

RESTART = 28  # 7 min in
DEAD_AT = 8  # the dead letters land 2 min in
DEAD = 'tokenfabric_dead_lettered_messages_total{job="processor", instance="b"}'
FIRES_DEAD = {"TokenfabricDeadLetters": [{"severity": "warning"}]}
NOBODY = {"TokenfabricWorkNobodyServes": [{"model": "nobody", "severity": "warning"}]}


def restarted(before: str, after: str) -> str:
    """``before`` up to the restart, one stale scrape, one with no sample, then ``after``."""
    return f"{before} stale _ {after}"


def restart_every_processor(series: Pipeline, keep: tuple[str, ...] = ()) -> Pipeline:
    """Every processor series but ``keep`` goes stale at the restart and comes back with its value
    (gauges as before; the test sets the counters and ages it cares about)."""
    for name, values in list(series.series.items()):
        if 'job="processor"' not in name or name in keep or name.startswith("up{"):
            continue
        first = values.split()[0]
        steady_value = first.split("x")[0] if "+" not in first else None
        if steady_value is not None:
            series.series[name] = restarted(
                f"{steady_value}x{RESTART - 1}", f"{steady_value}x{END - RESTART - 2}"
            )
    return series


def dead_letters_then_restart(after: str) -> Pipeline:
    """Processor b dead-letters two messages at 2 min; every processor restarts at 7 min."""
    series = restart_every_processor(Pipeline.healthy(), keep=(DEAD,))
    series.series[DEAD] = restarted(f"0x{DEAD_AT - 1} 2x{RESTART - DEAD_AT - 1}", after)
    return series


def test_a_restart_exports_counters_from_zero_and_no_dead_letter_alert_fires(tmp_path: Path) -> None:
    """What a restarted processor exports now: its own count, 0. The dead letters of minute 2 fire
    the alert for the 5-minute window; the restart at 7 min fires nothing."""
    series = dead_letters_then_restart(f"0x{END - RESTART - 2}")
    checks = expect(minutes(3), FIRES_DEAD, ["TokenfabricDeadLetters"])
    for at in (minutes(7) + 45, minutes(8), minutes(10), minutes(12)):
        checks += expect(at, {}, ["TokenfabricDeadLetters"])
    run_rule_tests(tmp_path, "restart, no new dead letters", series, checks)


def test_a_dead_letter_after_the_restart_still_fires(tmp_path: Path) -> None:
    """The counter the new process exports grows from 0 at the next dead letter (11 min in)."""
    new_at = 44 - RESTART - 2
    series = dead_letters_then_restart(f"0x{new_at} 1x{END - RESTART - 3 - new_at}")
    checks = expect(minutes(10), {}, ["TokenfabricDeadLetters"])
    checks += expect(minutes(11) + 30, FIRES_DEAD, ["TokenfabricDeadLetters"])
    run_rule_tests(tmp_path, "restart, then a dead letter", series, checks)


def test_the_restored_total_an_earlier_version_exported_would_read_as_new_dead_letters(
    tmp_path: Path,
) -> None:
    """The series of the issue (``2x80 0 2x40``): the total exported again after a 0 reads as two new
    dead letters to ``increase()``. Why the counters export only what the process counted."""
    series = dead_letters_then_restart(f"0 2x{END - RESTART - 3}")
    checks = expect(minutes(8), FIRES_DEAD, ["TokenfabricDeadLetters"])
    run_rule_tests(tmp_path, "the old export", series, checks)


def test_work_nobody_serves_keeps_its_clock_when_every_processor_restarts(tmp_path: Path) -> None:
    """Items of ``nobody`` wait from the start; every processor restarts at 7 min and restores them
    with their first arrival. The alert fires at 10 min, as without the restart, not at 17."""
    series = restart_every_processor(Pipeline.healthy().with_unserved_model())
    age = UNSERVED_AGE.format(target="b")
    series.series[age] = restarted(
        f"0+{STEP_S}x{RESTART - 1}", f"{(RESTART + 2) * STEP_S}+{STEP_S}x{END - RESTART - 2}"
    )
    checks = expect(minutes(9) + 45, {}, ["TokenfabricWorkNobodyServes"])
    checks += expect(minutes(10) + 15, NOBODY, ["TokenfabricWorkNobodyServes"])
    checks += expect(minutes(16), NOBODY, ["TokenfabricWorkNobodyServes"])
    run_rule_tests(tmp_path, "unserved through a restart of every processor", series, checks)
