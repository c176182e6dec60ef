"""The shipped alert rules under a real Prometheus (Debian's ``prometheus`` binary) scraping a real
pipeline every second: two processors and two consumers as processes, a clean stretch in which no
alert fires, then a script of faults, each named at the instant it lands:

1. items for a model nobody serves: the oldest item's wait past its limit
   (TokenfabricItemsWaitTooLong), then TokenfabricWorkNobodyServes (judged on that age);
2. SIGKILL of processor p1: its target down, its partitions unowned, p1 STALE, the lag of its
   partitions growing, and TokenfabricWorkNobodyServes still firing **since the same instant**
   (p0 reports the pipeline's unserved items, a dead instance's included);
3. SIGKILL of consumer ``small``, which holds batches: its target down, and it is stalled;
4. the producers stop: ``status`` and the exported figures (the group's lag, the ledger, which
   instances are STALE) agree, and Kafka's own ConsumerGroupCommand reads the same lag.

The rules are the shipped ones (processor.ops.alerts) rendered with short thresholds, each an
:class:`AlertSettings` field, so every alert fires in seconds; the shipped thresholds are tested with
promtool in tests/ops/test_alert_rules.py. At the end every query of the Grafana dashboard is run
against this Prometheus during the fault and must answer with data.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.ops.alerts import AlertSettings, render
from processor.ops.status import gather, report
from tests.broker.rig import CARDS, Rig, running_rig, wait_for
from tests.k8s.test_dashboard import MACROS, dashboard, exprs

pytestmark = pytest.mark.kafka

#: The shipped rules with thresholds short enough for a test (seconds; each documented in
#: docs/alerts.md). The evaluation and scrape interval is 1 s.
SHORT = AlertSettings(
    down_for_s=3,
    no_processor_for_s=3,
    stale_s=6,
    stale_for_s=2,
    unowned_for_s=3,
    lag_min_messages=40,
    lag_window_s=15,
    lag_for_s=2,
    unserved_for_s=16,  # fires before the kill, and must go on firing since the same instant after it
    restart_gap_s=600,  # p1's last age of the unserved items counts through the test
    wait_s=14,  # a loaded 2-core CI machine held clean-run items 9 s once (at 8 s the alert fired)
    wait_for_s=2,
    consumer_silent_s=10,  # a sim card on a loaded 2-core machine can be slow for a few seconds
    imbalance_for_s=3,
    dead_letter_window_s=30,
)
#: Slack on top of an alert's thresholds: scrapes and evaluations every second, a pipeline read
#: every second, a commit every 200 ms, on a shared 2-core machine.
SLACK_S = 8.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A Prometheus server on a free port, its data in ``home``, scraping ``targets`` (job -> host:port
    list) every second and evaluating ``rules`` every second."""

    def __init__(self, home: Path, targets: dict[str, list[str]], rules: str) -> None:
        exe = shutil.which("prometheus")
        assert exe is not None, "prometheus is not installed: apt-get install prometheus (CI does, .ci/run)"
        (home / "rules.yml").write_text(rules)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(home / "rules.yml")],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in targets.items()
            ],
        }
        (home / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (home / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                exe,
                f"--config.file={home / 'prometheus.yml'}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self.ready, 30, "Prometheus to start", poll_s=0.2)

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited {self.proc.returncode}"
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@contextmanager
def prometheus(home: Path, targets: dict[str, list[str]], rules: str) -> Iterator[Prometheus]:
    server = Prometheus(home, targets, rules)
    try:
        yield server
    finally:
        server.close()


def find(alerts: list[dict[str, Any]], name: str, **labels: str) -> dict[str, Any] | None:
    for alert in alerts:
        have = alert["labels"]
        if have["alertname"] == name and all(have.get(k) == v for k, v in labels.items()):
            return alert
    return None


def await_alert(
    prom: Prometheus, name: str, state: str, within_s: float, since: float, **labels: str
) -> dict[str, Any]:
    """Wait until alert ``name`` with ``labels`` is in ``state`` (``firing``, or ``pending`` which
    firing also satisfies); fails when that takes more than ``within_s`` after ``since``."""
    wanted = {"pending": ("pending", "firing"), "firing": ("firing",)}[state]
    found: dict[str, Any] = {}

    def there() -> bool:
        alert = find(prom.alerts(), name, **labels)
        if alert is not None and alert["state"] in wanted:
            found.update(alert)
            return True
        return False

    wait_for(there, max(1.0, since + within_s - time.monotonic()), f"{name}{labels} {state}", poll_s=0.5)
    return found


def produce_steadily(rig: Rig, per_s: float, stop: threading.Event) -> threading.Thread:
    """Items of model ``default`` over 12 shapes (so every ingest partition gets some) until ``stop``."""

    def run() -> None:
        with TokenProducer(rig.conf, rig.topics) as producer:
            n = 0
            while not stop.is_set():
                item_id = f"s{n}"
                producer.send(item_id, "default", synthetic_tokens(item_id, 40 + n % 300), shape=1 + n % 12)
                n += 1
                time.sleep(1 / per_s)

    thread = threading.Thread(target=run, name="steady-producer", daemon=True)
    thread.start()
    return thread


def test_the_shipped_alerts_fire_for_each_fault_and_never_in_a_clean_run(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ports = {name: free_port() for name in ("p0", "p1", "small", "large")}
    host = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    stop = threading.Event()
    with running_rig(kafka_bootstrap, tmp_path, ingest_partitions=6, consumer_threads=False) as rig:
        for contract in CARDS:
            rig.spawn_consumer(
                contract.consumer, contract, extra=("--metrics-port", str(ports[contract.consumer]))
            )
        for instance in ("p0", "p1"):
            # items wait up to --max-wait-ms by design (60 s by default): keep it below SHORT.wait_s
            extra = ("--metrics-port", str(ports[instance]), "--max-wait-ms", "2000")
            rig.spawn_processor(instance, instance=instance, extra=extra)
        home = tmp_path / "prometheus"
        home.mkdir()
        targets = {
            "tokenfabric-processor": [host["p0"], host["p1"]],
            "tokenfabric-consumer": [host["small"], host["large"]],
        }
        producer = produce_steadily(rig, per_s=25, stop=stop)
        try:
            with prometheus(home, targets, render(SHORT)) as prom:
                run_the_script(rig, prom, host, stop)
        finally:
            stop.set()
            producer.join(10)


def run_the_script(rig: Rig, prom: Prometheus, host: dict[str, str], stop: threading.Event) -> None:
    # -- start: every target up, the partitions split, the pipeline read by both processors --------
    def settled() -> bool:
        up = prom.query("sum(up)")
        owned = prom.query("sum(tokenfabric_ingest_owned_partitions)")
        read = prom.query("count(tokenfabric_pipeline_ingest_partitions == 6)")
        return (
            bool(up and owned and read)
            and not prom.alerts()  # the start (a rebalance, contracts read) is not the clean run
            and float(up[0]["value"][1]) == 4
            and float(owned[0]["value"][1]) == 6
            and float(read[0]["value"][1]) == 2
        )

    wait_for(settled, 60, "four targets up, six partitions owned, no alert", poll_s=0.5)

    # -- clean: 10 s of traffic and no alert fires. One may turn pending and clear (a card slowed by a
    # loaded machine past the short silence threshold): that is what an alert's `for` is for.
    clean_until = time.monotonic() + 10
    while time.monotonic() < clean_until:
        rig.pipeline.check_alive()
        firing = [a for a in prom.alerts() if a["state"] == "firing"]
        assert firing == [], f"an alert fired in the clean run: {firing}"
        time.sleep(0.5)

    # -- fault 1: items of a model nobody serves, on every partition ---------------------------------
    landed = time.monotonic()
    with TokenProducer(rig.conf, rig.topics) as producer:
        for i in range(24):
            producer.send(f"orphan-{i}", "nobody", synthetic_tokens(f"orphan-{i}", 30), shape=100 + i)
    await_alert(
        prom, "TokenfabricItemsWaitTooLong", "firing", SHORT.wait_s + SHORT.wait_for_s + SLACK_S, landed,
        model="nobody",
    )  # fmt: skip
    unserved = await_alert(
        prom, "TokenfabricWorkNobodyServes", "firing", SHORT.unserved_for_s + SLACK_S, landed, model="nobody"
    )
    unserved_since = unserved["activeAt"]

    # -- fault 2: SIGKILL of processor p1 ------------------------------------------------------------
    killed = time.monotonic()
    p1 = rig.pipeline.procs["p1"]
    p1.send_signal(signal.SIGKILL)
    assert p1.wait(30) == -signal.SIGKILL
    await_alert(
        prom, "TokenfabricTargetDown", "firing", SHORT.down_for_s + SLACK_S, killed,
        job="tokenfabric-processor", instance=host["p1"],
    )  # fmt: skip
    await_alert(prom, "TokenfabricIngestPartitionsUnowned", "firing", SHORT.unowned_for_s + SLACK_S, killed)
    await_alert(
        prom, "TokenfabricProcessorStale", "firing", SHORT.stale_s + SHORT.stale_for_s + SLACK_S, killed,
        processor="p1",
    )  # fmt: skip
    # 25 items/s over 12 shapes: each of p1's three partitions gains 40 messages in about 10 s
    await_alert(
        prom, "TokenfabricIngestLagGrowing", "firing", SHORT.lag_window_s + SHORT.lag_for_s + SLACK_S, killed
    )
    still = find(prom.alerts(), "TokenfabricWorkNobodyServes", model="nobody")
    assert still is not None and still["activeAt"] == unserved_since, (
        f"the unserved clock restarted when p1 died: {still} (was active since {unserved_since})"
    )

    # -- fault 3: SIGKILL of consumer small while it holds batches ------------------------------------
    # small answers at once while alive; once dead, p0 goes on sending it batches up to its limit
    killed = time.monotonic()
    small = rig.pipeline.procs["small"]
    small.send_signal(signal.SIGKILL)
    assert small.wait(30) == -signal.SIGKILL
    await_alert(
        prom, "TokenfabricTargetDown", "firing", SHORT.down_for_s + SLACK_S, killed,
        job="tokenfabric-consumer", instance=host["small"],
    )  # fmt: skip
    await_alert(
        prom, "TokenfabricConsumerStalled", "firing", 2 * SHORT.consumer_silent_s + SLACK_S, killed,
        consumer="small",
    )  # fmt: skip

    # -- what never fired: the ledger balanced, nothing was dead-lettered, a processor was always up --
    names = {a["labels"]["alertname"] for a in prom.alerts()}
    assert not names & {"TokenfabricLedgerImbalance", "TokenfabricDeadLetters", "TokenfabricNoProcessor"}

    # -- during the outage, status and the metrics agree: the producers stop, the figures settle -----
    stop.set()

    def agree() -> bool:
        rep = report(gather(rig.conf, rig.topics, rig.group), rig.topics)
        lag = prom.query("sum(max by (partition) (tokenfabric_pipeline_ingest_lag_messages))")
        received = prom.query('max(tokenfabric_pipeline_tokens{stage="received"})')
        stale = prom.query("max by (processor) (tokenfabric_pipeline_processor_stale) == 1")
        return (
            bool(lag and received)
            and float(lag[0]["value"][1]) == rep.ingest.uncommitted_messages
            and float(received[0]["value"][1]) == rep.ledger["received"].tokens
            and sorted(r["metric"]["processor"] for r in stale)
            == sorted(p.instance for p in rep.processors if p.state == "stale")
        )

    wait_for(agree, 20, "status and the pipeline metrics to agree", poll_s=1.0)
    # ... and Kafka's own ConsumerGroupCommand reads the same lag (LAG is column 6 of --describe)
    bootstrap = rig.conf["bootstrap.servers"]
    tool = [sys.executable, "-m", "processor", "kafka", "consumer-groups", "--bootstrap-server", bootstrap]
    described = subprocess.run(
        [*tool, "--describe", "--group", rig.group], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    rows = [line.split() for line in described.splitlines()]
    kafka_lag = sum(int(r[5]) for r in rows if len(r) > 5 and r[1] == rig.topics.ingest and r[5].isdigit())
    assert (
        kafka_lag == report(gather(rig.conf, rig.topics, rig.group), rig.topics).ingest.uncommitted_messages
    )

    # -- the dashboard during the fault: every query answers with data --------------------------------
    empty = []
    for title, expr in exprs(dashboard()):
        for macro, value in {**MACROS, "$__rate_interval": "10s"}.items():
            expr = expr.replace(macro, value)
        if not prom.query(expr):
            empty.append(f"{title}: {expr}")
    assert not empty, "dashboard queries with no data during the fault:\n" + "\n".join(empty)
