"""The shipped alert rules (k8s/prometheus/tokenfabric-alerts.yml, processor/ops/alerts.py) under
Prometheus' own tools: ``promtool check rules`` on the file, and ``promtool test rules`` with input
series for each fault and for a clean run, in which no alert may fire.

Each fault is a script of series on a 15 s scrape interval: two processors (targets ``a`` and ``b``,
instances ``p0`` and ``p1``, three of six ingest partitions each) and one consumer (``gpu0``), with
the instant each fault lands named. Annotations are checked by ``promtool check rules`` (their
templates parse); the unit tests compare labels, so the rules run with their annotations left out.
promtool comes from Debian's ``prometheus`` package, which CI installs (.ci/run).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from processor.ops.alerts import RULES, AlertSettings, RuleSpec, heading_anchor, render, rule_groups, rules
from tests.common import ROOT

RULE_FILE = ROOT / "k8s" / "prometheus" / "tokenfabric-alerts.yml"
ALERTS = [r["alert"] for r in rules()]
STEP_S = 15
KILL = 20  # the step at which a fault lands: 5 minutes in
END = 160  # 40 minutes of series


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    assert exe is not None, "promtool is not installed: apt-get install prometheus (CI does, .ci/run)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


# -- series ---------------------------------------------------------------------------------------


#: The oldest waiting item of the unserved model ``nobody``, as the processor at ``target`` reports it.
UNSERVED_AGE = (
    'tokenfabric_oldest_waiting_age_seconds{{job="processor", instance="{target}", model="nobody"}}'
)


def steady(value: float, steps: int = END) -> str:
    return f"{value}x{steps}"


def until_kill(values: str) -> str:
    """The first of ``values`` up to the fault, then the target is gone (a stale marker: the series
    ends)."""
    first = values.split()[0].split("x")[0].split("+")[0]
    return f"{first}x{KILL} stale"


def growing(start: float, per_step: float, steps: int = END) -> str:
    return f"{start}+{per_step}x{steps}"


def flat_after_kill(start: float, per_step: float) -> str:
    """A counter that grows until the fault and stands still after it."""
    at_kill = start + per_step * KILL
    return f"{start}+{per_step}x{KILL} {at_kill}x{END - KILL}"


def grows_after_kill(before: float, per_step: float) -> str:
    """A gauge that holds ``before`` until the fault and then grows ``per_step`` per scrape."""
    return f"{before}x{KILL} {before}+{per_step}x{END - KILL}"


@dataclass
class Pipeline:
    """The series of a healthy pipeline; a fault replaces some of them."""

    series: dict[str, str] = field(default_factory=dict)

    @classmethod
    def healthy(cls) -> Pipeline:
        s: dict[str, str] = {}
        targets = {"a": ("processor", "p0"), "b": ("processor", "p1"), "c": ("consumer", "gpu0")}
        for target, (job, _name) in targets.items():
            where = f'job="{job}", instance="{target}"'
            s[f"up{{{where}}}"] = steady(1)
            s[f'tokenfabric_build_info{{{where}, version="0.1.0"}}'] = steady(1)
        for target in ("a", "b"):
            where = f'job="processor", instance="{target}"'
            s[f"tokenfabric_step_age_seconds{{{where}}}"] = steady(0.2)
            s[f"tokenfabric_ingest_owned_partitions{{{where}}}"] = steady(3)
            s[f"tokenfabric_pipeline_ingest_partitions{{{where}}}"] = steady(6)
            s[f'tokenfabric_ledger_imbalance_tokens{{{where}, model="m", equation="received"}}'] = steady(0)
            s[f"tokenfabric_ledger_ok{{{where}}}"] = steady(1)
            s[f"tokenfabric_dead_lettered_messages_total{{{where}}}"] = steady(0)
            s[f'tokenfabric_oldest_waiting_age_seconds{{{where}, model="m"}}'] = "1 3 2 0.5 " * (END // 4)
            s[f'tokenfabric_consumer_in_flight_batches{{{where}, consumer="gpu0", model="m"}}'] = (
                "1 2 0 1 " * (END // 4)
            )
            s[f'tokenfabric_consumer_completed_items_total{{{where}, consumer="gpu0"}}'] = growing(0, 40)
            s[f'tokenfabric_consumer_failed_items_total{{{where}, consumer="gpu0"}}'] = steady(0)
            for processor in ("p0", "p1"):  # each live processor reports every instance's checkpoint
                s[f'tokenfabric_pipeline_checkpoint_age_seconds{{{where}, processor="{processor}"}}'] = (
                    "0.2 0.6 0.4 " * (END // 3 + 1)
                )
            for partition in range(6):
                s[f'tokenfabric_pipeline_ingest_lag_messages{{{where}, partition="{partition}"}}'] = (
                    "0 4 12 3 " * (END // 4)
                )
        consumer = 'job="consumer", instance="c", consumer="gpu0"'
        s[f"tokenfabric_consumer_app_dead_lettered_batches_total{{{consumer}}}"] = steady(0)
        return cls(s)

    def processor_b_killed(self) -> Pipeline:
        """SIGKILL of processor p1 (target b) at KILL: its series end, p0 keeps reporting p1's
        checkpoint, ever older, and the lag of p1's partitions (3, 4, 5), ever larger."""
        for name, values in list(self.series.items()):
            if 'instance="b"' in name:
                self.series[name] = until_kill(values)
        self.series['up{job="processor", instance="b"}'] = f"1x{KILL} 0x{END - KILL}"
        where = 'job="processor", instance="a"'
        self.series[f'tokenfabric_pipeline_checkpoint_age_seconds{{{where}, processor="p1"}}'] = (
            grows_after_kill(0.3, STEP_S)
        )
        for partition in (3, 4, 5):
            self.series[f'tokenfabric_pipeline_ingest_lag_messages{{{where}, partition="{partition}"}}'] = (
                grows_after_kill(2, 10)
            )
        return self

    def with_unserved_model(self) -> Pipeline:
        """Items of model ``nobody`` wait from the start, reported by both processors; p1 (target b)
        holds them: its oldest waiting item's age grows with the clock."""
        for target in ("a", "b"):
            name = (
                f'tokenfabric_pipeline_unserved_items{{job="processor", instance="{target}", model="nobody"}}'
            )
            self.series[name] = steady(20)
        self.series[UNSERVED_AGE.format(target="b")] = growing(0, STEP_S)
        return self

    def to_input(self) -> list[dict[str, str]]:
        return [{"series": name, "values": values.strip()} for name, values in self.series.items()]


def expect(
    at_s: int, firing: dict[str, list[dict[str, str]]], alerts: list[str] | None = None
) -> list[dict[str, Any]]:
    """promtool's ``alert_rule_test`` entries at ``at_s``: ``firing`` alerts with their labels, every
    other alert (of ``alerts``, default all) firing nothing."""
    out = []
    for alert in alerts or ALERTS:
        out.append(
            {
                "eval_time": f"{at_s}s",
                "alertname": alert,
                "exp_alerts": [{"exp_labels": labels} for labels in firing.get(alert, [])],
            }
        )
    return out


def run_rule_tests(tmp_path: Path, name: str, series: Pipeline, checks: list[dict[str, Any]]) -> None:
    groups = rule_groups()
    for rule in groups["groups"][0]["rules"]:
        rule.pop("annotations")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(groups, sort_keys=False))
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": f"{STEP_S}s",
        "tests": [
            {
                "name": name,
                "interval": f"{STEP_S}s",
                "input_series": series.to_input(),
                "alert_rule_test": checks,
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def minutes(m: float) -> int:
    return int(m * 60)


# -- the file -------------------------------------------------------------------------------------


def test_the_shipped_file_is_the_rendering_with_the_default_thresholds() -> None:
    assert RULE_FILE.read_text() == render(), "regenerate: python -m processor.ops.alerts > " + str(RULE_FILE)


def test_promtool_accepts_the_shipped_rules() -> None:
    out = promtool("check", "rules", str(RULE_FILE))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in out.stdout


def test_every_alert_says_how_bad_and_what_to_do() -> None:
    required = {
        "TokenfabricTargetDown", "TokenfabricProcessorStale", "TokenfabricIngestPartitionsUnowned",
        "TokenfabricIngestLagGrowing", "TokenfabricWorkNobodyServes", "TokenfabricItemsWaitTooLong",
        "TokenfabricConsumerStalled", "TokenfabricLedgerImbalance", "TokenfabricDeadLetters",
    }  # fmt: skip
    assert required <= set(ALERTS)
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 80, rule["alert"]
        assert "for" in rule


def test_thresholds_are_settings_that_reach_the_rules() -> None:
    short = AlertSettings(stale_s=7, consumer_silent_s=10, down_for_s=2)
    by_name = {r["alert"]: r for r in rules(short)}
    assert "> 7" in by_name["TokenfabricProcessorStale"]["expr"]
    assert "[10s]" in by_name["TokenfabricConsumerStalled"]["expr"]
    assert by_name["TokenfabricConsumerStalled"]["for"] == "10s"
    assert by_name["TokenfabricTargetDown"]["for"] == "2s"


def test_every_placeholder_of_the_rule_table_names_a_setting() -> None:
    """A ``${field}`` left unfilled would reach Prometheus as text; a ``for:`` naming no setting would
    fail only when rendered."""
    fields = set(AlertSettings.__dataclass_fields__)
    for spec in RULES:
        named = re.findall(r"\$\{(?:duration )?([a-z_]+)\}", spec.expr + spec.summary + spec.description)
        assert set(named) <= fields, spec.alert
        assert spec.for_setting in fields or spec.for_setting == "", spec.alert
    for rule in rules():
        assert "${" not in rule["expr"] + rule["annotations"]["summary"] + rule["annotations"]["description"]


# -- promtool test rules: a clean run and each fault ------------------------------------------------


def test_a_clean_run_fires_nothing(tmp_path: Path) -> None:
    checks = [c for at in (minutes(1), minutes(10), minutes(20), minutes(39)) for c in expect(at, {})]
    run_rule_tests(tmp_path, "clean", Pipeline.healthy(), checks)


def test_a_killed_processor_is_down_stale_and_leaves_partitions_unowned_and_lag_growing(
    tmp_path: Path,
) -> None:
    """p1 (target b) is SIGKILLed at 5 min. Down fires after 1 min of ``up == 0``; STALE once its
    checkpoint is 30 s old, plus 30 s; the unowned partitions after 1 min; the lag of its three
    partitions once above 100 messages and rising for 5 min."""
    series = Pipeline.healthy().processor_b_killed()
    b = {"job": "processor", "instance": "b"}
    down = {"TokenfabricTargetDown": [{**b, "severity": "critical"}]}
    stale = {"TokenfabricProcessorStale": [{"processor": "p1", "severity": "critical"}]}
    unowned = {"TokenfabricIngestPartitionsUnowned": [{"severity": "critical"}]}
    lag = {"TokenfabricIngestLagGrowing": [{"partition": str(p), "severity": "warning"} for p in (3, 4, 5)]}
    checks = expect(minutes(5), {})  # the instant of the kill: nothing yet
    checks += expect(minutes(5) + 45, {}, ["TokenfabricTargetDown", "TokenfabricIngestPartitionsUnowned"])
    checks += expect(minutes(6) + 30, {**down, **stale, **unowned})
    checks += expect(minutes(20), {**down, **stale, **unowned, **lag})
    run_rule_tests(tmp_path, "processor killed", series, checks)


def test_work_nobody_serves_keeps_its_clock_when_the_instance_holding_it_dies(tmp_path: Path) -> None:
    """Unserved items from the start; p1, which holds them, dies at 5 min and p0 adopts them a minute
    later (their first arrival restored). The alert still fires at 10 min, not at 15: p0 goes on
    reporting the pipeline's unserved items, and the items' age goes on from where it was."""
    series = Pipeline.healthy().with_unserved_model().processor_b_killed()
    adopted = KILL + 4
    series.series[UNSERVED_AGE.format(target="b")] = f"0+{STEP_S}x{KILL} stale"
    series.series[UNSERVED_AGE.format(target="a")] = (
        f"_x{adopted} {adopted * STEP_S}+{STEP_S}x{END - adopted}"
    )
    nobody = {"TokenfabricWorkNobodyServes": [{"model": "nobody", "severity": "warning"}]}
    checks = expect(minutes(9) + 45, {}, ["TokenfabricWorkNobodyServes"])
    checks += expect(minutes(10) + 15, nobody, ["TokenfabricWorkNobodyServes"])
    run_rule_tests(tmp_path, "unserved through a death", series, checks)


def test_a_consumer_holding_batches_that_answers_nothing_is_stalled_and_down(tmp_path: Path) -> None:
    """The consumer is SIGKILLed at 5 min while it holds batches: its completions stand still. It is
    down after 1 min, stalled once 2 min have passed without an answer, plus 2 min."""
    series = Pipeline.healthy()
    for name in list(series.series):
        if "consumer_completed_items_total" in name:
            series.series[name] = flat_after_kill(0, 40)
        if "consumer_in_flight_batches" in name:
            series.series[name] = steady(2)
        if 'instance="c"' in name:
            series.series[name] = until_kill(series.series[name])
    series.series['up{job="consumer", instance="c"}'] = f"1x{KILL} 0x{END - KILL}"
    stalled = {"TokenfabricConsumerStalled": [{"consumer": "gpu0", "severity": "critical"}]}
    down = {"TokenfabricTargetDown": [{"job": "consumer", "instance": "c", "severity": "critical"}]}
    checks = expect(minutes(8), down)  # silent for 3 min: not yet 2 + 2
    checks += expect(minutes(10), {**down, **stalled})
    run_rule_tests(tmp_path, "consumer killed", series, checks)


def test_no_processor_at_all_is_an_alert(tmp_path: Path) -> None:
    series = Pipeline.healthy()
    series.series = {n: v for n, v in series.series.items() if "step_age" not in n}
    checks = expect(minutes(0.5), {}, ["TokenfabricNoProcessor"])
    checks += expect(
        minutes(2), {"TokenfabricNoProcessor": [{"severity": "critical"}]}, ["TokenfabricNoProcessor"]
    )
    run_rule_tests(tmp_path, "no processor", series, checks)


def test_items_waiting_too_long_a_ledger_imbalance_and_dead_letters(tmp_path: Path) -> None:
    """From 5 min: the oldest item's age grows one second per second, p0's ledger is 5 tokens off,
    and three ingest messages are dead-lettered once (the alert lasts the 5-minute window)."""
    series = Pipeline.healthy()
    where = 'job="processor", instance="a"'
    series.series[f'tokenfabric_oldest_waiting_age_seconds{{{where}, model="m"}}'] = grows_after_kill(
        1, STEP_S
    )
    series.series[f'tokenfabric_ledger_imbalance_tokens{{{where}, model="m", equation="received"}}'] = (
        f"0x{KILL} 5x{END - KILL}"
    )
    series.series[f"tokenfabric_dead_lettered_messages_total{{{where}}}"] = f"0x{KILL} 3x{END - KILL}"
    wait = {"TokenfabricItemsWaitTooLong": [{"model": "m", "severity": "warning"}]}
    imbalance = {
        "TokenfabricLedgerImbalance": [
            {**dict(job="processor", instance="a", model="m", equation="received"), "severity": "critical"}
        ]
    }
    dead = {"TokenfabricDeadLetters": [{"severity": "warning"}]}
    checks = expect(minutes(5), {})
    checks += expect(minutes(8), {**imbalance, **dead})  # waited 3 min: not yet 5 + 1
    checks += expect(minutes(11) + 30, {**wait, **imbalance})  # the dead letters left the window
    run_rule_tests(tmp_path, "wait, imbalance, dead letters", series, checks)


def test_a_broker_away_is_an_alert_while_every_target_stays_up(tmp_path: Path) -> None:
    """Every process reports ``tokenfabric_broker_reachable`` 1; a 15 s blip at 2 min fires nothing;
    from 5 min all three wait for Kafka (0) and stay up: the alert fires after 30 s, while
    TokenfabricTargetDown does not (issue 36: only "target down" used to say so, after ~70 s)."""
    series = Pipeline.healthy()
    for target, job in (("a", "processor"), ("b", "processor"), ("c", "consumer")):
        blip = "1x7 0 " + f"1x{KILL - 9} "
        series.series[f'tokenfabric_broker_reachable{{job="{job}", instance="{target}"}}'] = (
            f"{blip}0x{END - KILL}"
        )
    away = {"TokenfabricBrokerUnreachable": [{"severity": "critical"}]}
    checks = expect(minutes(2) + 15, {})  # the blip: one scrape at 0, shorter than the for: clock
    checks += expect(minutes(5) + 15, {})
    checks += expect(minutes(6), away)
    checks += expect(minutes(20), away)
    run_rule_tests(tmp_path, "broker away", series, checks)


@pytest.mark.parametrize("alert", ALERTS)
def test_every_alert_is_exercised_by_a_fault(alert: str) -> None:
    """Each rule appears, firing, in some fault above (this file's text names it in a firing map)."""
    text = Path(__file__).read_text()
    assert f'"{alert}": [' in text, f"no fault test expects {alert} to fire"


# -- the docs ---------------------------------------------------------------------------------------

DOCS_WITH_RULES = (ROOT / "docs" / "alerts.md", ROOT / "docs" / "metrics.md")


def rule_blocks(path: Path) -> list[str]:
    """Every ```yaml block of ``path`` that is a rule file (it has ``groups:``)."""
    blocks = re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S)
    return [b for b in blocks if re.search(r"^groups:", b, re.M)]


@pytest.mark.parametrize("path", DOCS_WITH_RULES, ids=[p.name for p in DOCS_WITH_RULES])
def test_every_rule_file_in_the_docs_passes_promtool(path: Path, tmp_path: Path) -> None:
    blocks = rule_blocks(path)
    for n, block in enumerate(blocks):
        file = tmp_path / f"block{n}.yml"
        file.write_text(block)
        out = promtool("check", "rules", str(file))
        assert out.returncode == 0, f"{path.name}, rule block {n}:\n{block}\n{out.stdout}{out.stderr}"
    if path.name == "alerts.md":
        assert blocks, "docs/alerts.md shows a rule of one's own"


def test_docs_alerts_describes_every_alert_and_every_threshold() -> None:
    text = (ROOT / "docs" / "alerts.md").read_text()
    for alert in ALERTS:
        assert f"| [`{alert}`](#{alert.lower()}) |" in text, f"{alert} has no row in docs/alerts.md"
    for name in AlertSettings.__dataclass_fields__:
        default = getattr(AlertSettings(), name)
        assert f"| `{name}` | {default} |" in text, f"threshold {name} ({default}) is not in docs/alerts.md"


def page_anchors(text: str) -> set[str]:
    """The anchors of every heading of a Markdown page (outside code blocks), as GitHub makes them."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", prose, re.M)}


def test_every_rule_has_a_runbook_url_that_resolves_to_a_heading_of_docs_alerts() -> None:
    anchors = page_anchors((ROOT / "docs" / "alerts.md").read_text())
    for rule in rules():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/alerts.md", rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: no heading #{anchor} in docs/alerts.md"


def test_a_rule_whose_runbook_heading_is_missing_is_caught() -> None:
    spec = RuleSpec("TokenfabricNew", "vector(1)", "", "warning", "s", "d")
    assert spec.runbook_anchor == "tokenfabricnew"
    assert spec.runbook_anchor not in page_anchors((ROOT / "docs" / "alerts.md").read_text())
    assert page_anchors("## How it works\n```\n# not a heading\n```\n") == {"how-it-works"}


def test_the_runbook_page_can_be_served_elsewhere() -> None:
    base = "https://git.example.com/tokenfabric/blob/main/docs/alerts.md"
    (first, *_) = rules(AlertSettings(runbook_base_url=base))
    assert first["annotations"]["runbook_url"] == f"{base}#tokenfabrictargetdown"
