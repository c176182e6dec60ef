"""The Grafana dashboard (k8s/grafana-dashboard.json): every query is PromQL that parses, and every
metric it names is one docs/metrics.md documents. That each is in a live scrape of a running
processor and consumer: tests/broker/test_metrics.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser

from tests.common import ROOT
from tests.ops.test_alert_rules import promtool

DASHBOARD = ROOT / "k8s" / "grafana-dashboard.json"

#: Grafana's macros, replaced by what they expand to before PromQL parses the query.
MACROS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}

#: Series Prometheus makes itself (target health), not exported by tokenfabric.
PROMETHEUS_OWN = {"up"}

#: Suffixes a histogram or counter series has beyond its documented family name.
SERIES_SUFFIXES = ("_bucket", "_count", "_sum")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def exprs(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' nested panels included."""
    out = []
    stack = list(board["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        out.extend((panel["title"], t["expr"]) for t in panel.get("targets", []))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects, from promql-parser's syntax tree."""
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    names: set[str] = set()
    stack: list[Any] = [promql_parser.parse(expr)]
    while stack:
        node = stack.pop()
        kind = type(node).__name__
        if kind == "VectorSelector":
            names.add(node.name)
        elif kind == "MatrixSelector":
            stack.append(node.vector_selector)
        elif kind == "BinaryExpr":
            stack += [node.lhs, node.rhs]
        elif kind == "Call":
            stack += list(node.args)
        elif kind in ("AggregateExpr", "ParenExpr", "UnaryExpr", "SubqueryExpr"):
            stack.append(node.expr)
            if kind == "AggregateExpr" and node.param is not None:
                stack.append(node.param)
    return names


def queried(board: dict[str, Any]) -> set[str]:
    """Every tokenfabric metric the board selects (Prometheus' own ``up`` left out)."""
    return {name for _, expr in exprs(board) for name in metric_names(expr)} - PROMETHEUS_OWN


def test_every_query_parses_and_names_a_documented_metric() -> None:
    board = dashboard()
    documented = set(
        re.findall(r"^\| `(tokenfabric_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    )
    pairs = exprs(board)
    assert len(pairs) >= 20
    for title, expr in pairs:
        names = metric_names(expr)  # raises on PromQL that does not parse
        assert names, f"{title}: {expr} selects no metric"
        for name in names - PROMETHEUS_OWN:
            family = next((name.removesuffix(s) for s in SERIES_SUFFIXES if name.endswith(s)), name)
            assert name in documented or family in documented, f"{title}: {name} is not in docs/metrics.md"


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    names = {name for _, expr in exprs(dashboard()) for name in metric_names(expr)}
    for needed in (
        "tokenfabric_ledger_imbalance_tokens",  # ledger balance
        "tokenfabric_completed_tokens_total",  # tokens/s
        "tokenfabric_consumer_padded_tokens_total",  # padding waste
        "tokenfabric_consumer_cache_hits_total",  # cache hits
        "tokenfabric_lanes_in_use",  # lanes
        "tokenfabric_consumer_app_lag_batches",  # lag per consumer
        "tokenfabric_item_queued_seconds_bucket",  # latency histograms
        "tokenfabric_consumer_app_end_to_end_seconds_bucket",
        "up",  # target health
        "tokenfabric_pipeline_checkpoint_age_seconds",  # STALE processors
        "tokenfabric_pipeline_ingest_lag_messages",  # the group's lag
        "tokenfabric_ingest_owned_partitions",  # partitions without a live owner
    ):
        assert needed in names
    board = dashboard()
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows[0] == "Health" and "Per instance" in rows
    by_instance = [e for title, e in exprs(board) if "by (instance" in e]
    assert len(by_instance) >= 5, "the per-instance row lost its panels"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert board["templating"]["list"][0]["type"] == "datasource"


def test_sums_that_are_zero_when_nothing_is_exported_say_0_instead_of_no_data() -> None:
    """An aggregation without ``by`` over series that may be absent (nothing lags, nothing is
    unserved) reads 0, not a gap: ``or vector(0)``. Quantiles and per-label figures are left alone."""
    for title, expr in exprs(dashboard()):
        outer = expr.split(" or ")[0]
        if outer.startswith(("sum(", "max(")) and "_ratio" not in outer and "ledger_ok" not in outer:
            assert "or vector(0)" in expr, f"{title}: {expr} shows no data where 0 is the truth"


def test_the_parser_finds_every_selector() -> None:
    expr = 'histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) / -(b{x="y"} offset 5m)'
    expr += " or max_over_time(c[5m:1m])"
    assert metric_names(expr) == {"a_bucket", "b", "c"}
    assert metric_names('topk(3, d) + count_values("v", e)') == {"d", "e"}


#: How a latency panel keeps its last value when idle: NaN quantiles (no observation in the rate
#: window) dropped by ``>= 0``, and the last quantile within the hour shown.
LAST_VALUE = re.compile(r"^last_over_time\(\(histogram_quantile\(.*\) >= 0\)\[1h:\]\)$")


def test_latency_panels_show_the_last_value_when_idle() -> None:
    quantiles = [(t, e) for t, e in exprs(dashboard()) if "histogram_quantile" in e]
    assert len(quantiles) >= 8
    for title, expr in quantiles:
        assert LAST_VALUE.match(expr), f"{title}: {expr} goes blank once its rate window holds nothing"


def test_an_idle_histogram_keeps_its_last_quantile_under_promtool(tmp_path: Path) -> None:
    """Items observed for 5 minutes, then none for 15: the panel's query still reads the last
    median 15 minutes later, where the bare quantile reads nothing."""
    (_, expr), *_ = [(t, e) for t, e in exprs(dashboard()) if "tokenfabric_item_queued_seconds_bucket" in e]
    expr = expr.replace("$__rate_interval", "2m")
    bare = expr[len("last_over_time((") : -len(")[1h:])")]  # the quantile >= 0, unwrapped
    series = "tokenfabric_item_queued_seconds_bucket"
    test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'{series}{{le="{le}", model="m"}}', "values": "0+10x5 50x20"}
                    for le in ("0.1", "+Inf")
                ],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "20m",
                        "exp_samples": [{"labels": '{model="m"}', "value": 0.05}],
                    },
                    {"expr": bare, "eval_time": "20m", "exp_samples": []},
                ],
            }
        ],
    }
    file = tmp_path / "idle.yml"
    file.write_text(json.dumps(test))
    out = promtool("test", "rules", str(file))
    assert out.returncode == 0, out.stdout + out.stderr
