"""The PrometheusRule in k8s/prometheus/ carries exactly the groups of the shipped rule file beside it
(k8s/prometheus/tokenfabric-alerts.yml, which tests/ops/test_alert_rules.py runs under promtool), and
every metric a rule selects is one docs/metrics.md documents."""

from __future__ import annotations

import re

import yaml

from processor.ops.alerts import rule_groups
from tests.common import ROOT
from tests.k8s.test_dashboard import metric_names

PROMETHEUS = ROOT / "k8s" / "prometheus"

#: Series Prometheus makes itself, not exported by tokenfabric.
PROMETHEUS_OWN = {"up"}


def test_the_prometheusrule_holds_the_rule_files_groups() -> None:
    (manifest,) = [d for d in yaml.safe_load_all((PROMETHEUS / "prometheusrule.yaml").read_text()) if d]
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["kind"] == "PrometheusRule"
    shipped = yaml.safe_load((PROMETHEUS / "tokenfabric-alerts.yml").read_text())
    assert manifest["spec"]["groups"] == shipped["groups"] == rule_groups()["groups"]


def test_every_metric_a_rule_selects_is_documented() -> None:
    documented = set(
        re.findall(r"^\| `(tokenfabric_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    )
    for rule in rule_groups()["groups"][0]["rules"]:
        for name in metric_names(rule["expr"]) - PROMETHEUS_OWN:
            assert name in documented, f"{rule['alert']}: {name} is not in docs/metrics.md"
