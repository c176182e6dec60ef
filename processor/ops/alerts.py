"""The Prometheus alert rules that ship with tokenfabric, with their thresholds as named settings.

Why in Python rather than only as YAML: every threshold is a documented setting (:class:`AlertSettings`,
docs/alerts.md), the shipped rule file ``k8s/prometheus/tokenfabric-alerts.yml`` and its
PrometheusRule are this module's rendering with the defaults (tests/k8s checks both are), and the
broker test renders the same rules with short thresholds to watch each one fire in seconds
(tests/broker/test_alerts.py). ``python -m processor.ops.alerts > k8s/prometheus/tokenfabric-alerts.yml``
writes the file again after a change.

The rules need no job names: a tokenfabric target is one that exported ``tokenfabric_build_info``,
a processor one that exports ``tokenfabric_step_age_seconds``. Figures about the whole pipeline come
from ``tokenfabric_pipeline_*``, which every live processor exports alike (processor.ops.pipeline_view),
so the rules take their ``max``/``min`` over reporters: an instance that dies leaves the others' series,
and an alert's ``for:`` clock is not restarted by the death of the instance that held the work.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

import yaml

GROUP = "tokenfabric"
#: The runbooks' page, as a path in the repository; set ``runbook_base_url`` to where you host it.
RUNBOOK_PAGE = "docs/alerts.md"


@dataclass(frozen=True, slots=True)
class AlertSettings:
    """Every threshold of the shipped rules (seconds unless named otherwise; docs/alerts.md)."""

    down_for_s: int = 60
    """A tokenfabric target unscraped (``up == 0``) this long: TokenfabricTargetDown."""
    seen_within_s: int = 86_400
    """A target counts as tokenfabric's if it exported ``tokenfabric_build_info`` within this."""
    no_processor_for_s: int = 60
    """No processor scraped at all this long: TokenfabricNoProcessor."""
    stale_s: int = 30
    """A processor whose last checkpoint is older is STALE (``tokenfabric status --stale-s``)."""
    stale_for_s: int = 30
    unowned_for_s: int = 60
    """Ingest partitions without a live owner this long: longer than a rebalance's restore."""
    lag_min_messages: int = 100
    """Ingest lag below this never counts as growing."""
    lag_window_s: int = 300
    lag_for_s: int = 300
    unserved_for_s: int = 600
    """Items waiting this long (from their first arrival) for a model no consumer announced:
    TokenfabricWorkNobodyServes. Judged on the items' age, which a restarted or adopting processor
    restores, not on a ``for:`` clock, which restarts whenever every processor does."""
    restart_gap_s: int = 180
    """How long an age series may vanish (a processor restarting, its partitions being adopted) and
    the alerts judged on it still see its last value."""
    wait_s: int = 300
    """The oldest waiting item's age (from its first arrival) past this: TokenfabricItemsWaitTooLong."""
    wait_for_s: int = 60
    consumer_silent_s: int = 120
    """A consumer holding batches that answered nothing for this long: TokenfabricConsumerStalled."""
    imbalance_for_s: int = 120
    dead_letter_window_s: int = 300
    """TokenfabricDeadLetters fires while a message was dead-lettered within this window."""
    runbook_base_url: str = RUNBOOK_PAGE
    """Where docs/alerts.md is served: each rule's ``runbook_url`` is this plus ``#`` and its anchor."""
    broker_away_for_s: int = 30
    """A process has waited this long for Kafka (``tokenfabric_broker_reachable == 0``):
    TokenfabricBrokerUnreachable."""


def duration(seconds: int) -> str:
    """A Prometheus duration: ``90`` -> ``90s``, ``120`` -> ``2m``, ``86400`` -> ``1d``."""
    if seconds < 0:
        raise ValueError(f"a duration must be >= 0 s, got {seconds}")
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One alert rule as written, before its thresholds are filled in.

    ``expr``, ``summary`` and ``description`` name settings as ``${field}`` (the number) or
    ``${duration field}`` (a Prometheus duration); Prometheus's own ``{{ $labels.x }}`` and ``$value``
    pass through untouched. ``for_setting`` names the setting that is the rule's ``for:`` ("" for 0s).
    ``runbook`` is the anchor of the rule's runbook heading in docs/alerts.md; "" means the heading is
    the alert's own name (``### TokenfabricTargetDown`` -> ``tokenfabrictargetdown``), so a new rule
    needs only its heading there (tests/ops/test_alert_rules.py checks every anchor resolves).
    """

    alert: str
    expr: str
    for_setting: str
    severity: str
    summary: str
    description: str
    runbook: str = ""

    @property
    def runbook_anchor(self) -> str:
        """The anchor of this rule's runbook heading in docs/alerts.md."""
        return self.runbook or heading_anchor(self.alert)


def heading_anchor(heading: str) -> str:
    """A Markdown heading's anchor as GitHub and GitLab make it: lower case, punctuation dropped,
    spaces to hyphens (``How to read it`` -> ``how-to-read-it``)."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


_SETTING = re.compile(r"\$\{(duration )?([a-z_]+)\}")


def _fill(text: str, s: AlertSettings) -> str:
    """``text`` with each ``${field}`` / ``${duration field}`` replaced by ``s``'s value."""

    def value(m: re.Match[str]) -> str:
        number: int = getattr(s, m.group(2))  # the thresholds, never runbook_base_url
        return duration(number) if m.group(1) else str(number)

    return _SETTING.sub(value, text)


def render_rule(spec: RuleSpec, s: AlertSettings) -> dict[str, Any]:
    """``spec`` with the thresholds of ``s``: one entry of a Prometheus rule group."""
    return {
        "alert": spec.alert,
        "expr": _fill(spec.expr, s),
        "for": duration(getattr(s, spec.for_setting) if spec.for_setting else 0),
        "labels": {"severity": spec.severity},
        "annotations": {
            "summary": _fill(spec.summary, s),
            "description": _fill(spec.description, s),
            "runbook_url": f"{s.runbook_base_url}#{spec.runbook_anchor}",
        },
    }


RULES: tuple[RuleSpec, ...] = (
    RuleSpec(
        "TokenfabricTargetDown",
        "up == 0 and on (job, instance) max_over_time(tokenfabric_build_info[${duration seen_within_s}])",
        "down_for_s",
        "critical",
        "tokenfabric target {{ $labels.instance }} ({{ $labels.job }}) is down or unscraped",
        "Prometheus cannot scrape {{ $labels.instance }}: the process is dead, hung before it serves "
        "/metrics, or unreachable. A processor's partitions wait for the group to hand them over "
        "(session timeout); a consumer's batches in flight wait for it. Check the pod (kubectl "
        "describe, logs, exit code 75 means restart me) and `tokenfabric status`.",
    ),
    RuleSpec(
        "TokenfabricNoProcessor",
        "absent(tokenfabric_step_age_seconds)",
        "no_processor_for_s",
        "critical",
        "no tokenfabric processor is scraped",
        "No processor exports metrics, so nothing takes ingest and nothing dispatches. Check the "
        "StatefulSet and the scrape configuration; `tokenfabric status` reads Kafka directly.",
    ),
    RuleSpec(
        "TokenfabricProcessorStale",
        "min by (processor) (tokenfabric_pipeline_checkpoint_age_seconds) > ${stale_s}",
        "stale_for_s",
        "critical",
        "processor {{ $labels.processor }} is STALE: last checkpoint {{ $value | humanizeDuration }} ago",
        "The instance has not checkpointed for over ${stale_s} s: dead, stuck, or restoring for "
        "that long (status shows it STALE). Its partitions and waiting items are held until it "
        "comes back or the group hands them over. Restart it; if it is gone for good, "
        "`tokenfabric status --forget-processor {{ $labels.processor }}`.",
    ),
    RuleSpec(
        "TokenfabricIngestPartitionsUnowned",
        "max(tokenfabric_pipeline_ingest_partitions)\n"
        "- (sum(tokenfabric_ingest_owned_partitions) or vector(0)) > 0",
        "unowned_for_s",
        "critical",
        "{{ $value }} ingest partitions have no live owner",
        "No scraped processor owns these ingest partitions: their items are neither read nor "
        "dispatched. After a crash the group hands them over once the session timeout expires; if "
        "this lasts, look for a STALE or down processor and restart it, or add an instance.",
    ),
    RuleSpec(
        "TokenfabricIngestLagGrowing",
        "min by (partition) (tokenfabric_pipeline_ingest_lag_messages) > ${lag_min_messages}\n"
        "and min by (partition) (\n"
        "  delta(tokenfabric_pipeline_ingest_lag_messages[${duration lag_window_s}])\n"
        ") > 0",
        "lag_for_s",
        "warning",
        "ingest partition {{ $labels.partition }} lag is growing ({{ $value }} messages)",
        "The processors' group falls behind on this partition: its owner is dead, stuck, paused by "
        "backpressure, or slower than the producers. Check TokenfabricIngestPartitionsUnowned, "
        "tokenfabric_ingest_paused and the processors' CPU; add instances (up to the partition count).",
    ),
    RuleSpec(
        "TokenfabricWorkNobodyServes",
        "max by (model) (tokenfabric_pipeline_unserved_items) > 0\n"
        "and on (model) (\n"
        "  max by (model) (max_over_time(tokenfabric_oldest_waiting_age_seconds"
        "[${duration restart_gap_s}]))\n"
        "  > ${unserved_for_s}\n"
        ")",
        "",
        "warning",
        "{{ $value }} items of model {{ $labels.model }} wait and no consumer serves the model",
        "Items wait for a model no consumer has announced a contract for. Start a consumer for "
        "the model (or fix the producers' model name); `tokenfabric status` lists them.",
    ),
    RuleSpec(
        "TokenfabricItemsWaitTooLong",
        "max by (model) (tokenfabric_oldest_waiting_age_seconds) > ${wait_s}",
        "wait_for_s",
        "warning",
        "the oldest item of model {{ $labels.model }} has waited {{ $value | humanizeDuration }}",
        "Items of this model wait longer than expected: too few consumers for the load, consumers "
        "stalled, or a job capped by its quota. Compare the model's queued tokens with its "
        "consumers' completed rate; add consumers or lift the quota.",
    ),
    RuleSpec(
        "TokenfabricConsumerStalled",
        "sum by (consumer) (tokenfabric_consumer_in_flight_batches) > 0\n"
        "unless on (consumer) (\n"
        "  sum by (consumer) (increase(tokenfabric_consumer_completed_items_total"
        "[${duration consumer_silent_s}]))\n"
        "  + sum by (consumer) (increase(tokenfabric_consumer_failed_items_total"
        "[${duration consumer_silent_s}])) > 0\n"
        ")",
        "consumer_silent_s",
        "critical",
        "consumer {{ $labels.consumer }} holds {{ $value }} batches and answered nothing for "
        "${duration consumer_silent_s}",
        "The consumer has batches in flight and no completion came back: its process is dead or "
        "hung, its engine is stuck, or it cannot write to the results topic. Its batches wait "
        "for it. Check its pod and logs; if it is gone for good, `tokenfabric status "
        "--retire-consumer {{ $labels.consumer }}` hands its batches to the others.",
    ),
    RuleSpec(
        "TokenfabricLedgerImbalance",
        "abs(tokenfabric_ledger_imbalance_tokens) > 0 or tokenfabric_ledger_ok == 0",
        "imbalance_for_s",
        "critical",
        "the ledger of {{ $labels.instance }} does not balance",
        "A ledger equation fails (tokens counted in and out differ): a bug. The processor stops "
        "without committing and restarts from its last commit. Keep its logs, run "
        "`tokenfabric audit`, and report it.",
    ),
    RuleSpec(
        "TokenfabricDeadLetters",
        "(sum(increase(tokenfabric_dead_lettered_messages_total"
        "[${duration dead_letter_window_s}])) or vector(0))\n"
        "+ (\n"
        "  sum(increase(tokenfabric_consumer_app_dead_lettered_batches_total"
        "[${duration dead_letter_window_s}])) or vector(0)\n"
        ")\n"
        "> 0",
        "",
        "warning",
        "{{ $value }} messages dead-lettered in the last ${duration dead_letter_window_s}",
        "Messages went to the dead-letter topic: undecodable or invalid ingest messages, repeated "
        "item ids, or batches a consumer could not decode. Read the dead-letter topic (each record "
        "says its reason) and fix the producer.",
    ),
    RuleSpec(
        "TokenfabricBrokerUnreachable",
        "count(tokenfabric_broker_reachable == 0) > 0",
        "broker_away_for_s",
        "critical",
        "{{ $value }} tokenfabric processes cannot reach Kafka",
        "A process's lookout gets no answer from Kafka; nothing moves meanwhile. Processors and "
        "consumers wait for a broker (live, not ready) and resume from their last commit; they "
        "exit 75 after --outage-exit-s (300 s by default). Check the brokers, the network "
        "between them and the pods, and `tokenfabric_broker_unreachable_seconds`.",
    ),
)


def rules(s: AlertSettings | None = None) -> list[dict[str, Any]]:
    """The alert rules, in the order docs/alerts.md describes them."""
    s = s or AlertSettings()
    return [render_rule(spec, s) for spec in RULES]


def rule_groups(s: AlertSettings | None = None) -> dict[str, Any]:
    """The rule file's content: ``{"groups": [...]}``, as ``promtool check rules`` reads it."""
    return {"groups": [{"name": GROUP, "rules": rules(s)}]}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as ``|`` blocks, so the PromQL reads as written."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)

HEADER = (
    "# tokenfabric's alert rules (docs/alerts.md), rendered by processor/ops/alerts.py with its default\n"
    "# thresholds: python -m processor.ops.alerts > k8s/prometheus/tokenfabric-alerts.yml\n"
)


def render(s: AlertSettings | None = None) -> str:
    """The rule file as text, the header comment first."""
    return HEADER + yaml.dump(rule_groups(s), Dumper=_Dumper, sort_keys=False, width=200)


if __name__ == "__main__":
    sys.stdout.write(render())
