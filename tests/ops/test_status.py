"""The status view and report (processor/ops/status.py) and their text and JSON forms
(processor/cli/status.py), from checkpoints built here: no broker."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from processor.cli.status import fold, render_text
from processor.core.contract import Contract
from processor.kafka.topics import TopicNames
from processor.ops.status import (
    SCHEMA_PATH,
    GroupFacts,
    StatusView,
    report,
    with_rates,
)
from processor.wire.records import LedgerSnapshotRecord

NOW = 1_800_000_000_000
LONG = "card-a100-80gb-eu-west-1-rack-17-slot-3"  # wider than the old table's consumer column


def checkpoint(
    name: str, counters: dict[str, int], slots: int = 1, age_s: float = 0.3, consumer: str = "c"
) -> LedgerSnapshotRecord:
    per_consumer = {consumer: {"slots": slots, "in_flight_batches": 1, "last_completion_ms": NOW - 400}}
    return LedgerSnapshotRecord(
        instance=name,
        taken_ms=int(NOW - age_s * 1000),
        sequence=1,
        counters=counters,
        per_model={},
        per_consumer=per_consumer,
    )


def test_status_counts_adopted_state_once_while_the_old_owner_is_down() -> None:
    """a crashed holding 10 waiting items; b adopted them. Until a restarts and releases, both
    checkpoints claim the 10; the view (and the audit) must count them once."""
    view = StatusView(read_ms=NOW)
    view.checkpoints["a"] = checkpoint("a", {"queued_items": 10, "queued_tokens": 500})
    view.checkpoints["b"] = checkpoint(
        "b",
        {"queued_items": 12, "queued_tokens": 600, "adopted_queued_items": 10, "adopted_queued_tokens": 500},
    )
    assert (view.held("queued_items"), view.held("queued_tokens")) == (12, 600)
    view.checkpoints["a"] = checkpoint(
        "a", {"queued_items": 0, "released_queued_items": 10, "released_queued_tokens": 500}
    )
    assert view.held("queued_items") == 12
    render_text(report(view, TopicNames()))  # renders with several instances without raising


def busy_view() -> StatusView:
    """Two instances (one dead for 5 minutes), a live consumer with a long id, a stale one, and
    items of a model nobody serves."""
    counters = {
        "received_items": 130, "received_tokens": 90_000, "queued_items": 120, "queued_tokens": 45_000,
        "queued_items@llama-70b": 100, "queued_tokens@llama-70b": 40_000,
        "queued_items@default": 20, "queued_tokens@default": 5_000,
        "owned_partitions": 3, "ingest_partitions": 6, "lanes_in_use": 4, "shapes": 4, "lane_budget": 8,
        f"batches#{LONG}": 10, f"oversized#{LONG}": 2, f"padded_tokens#{LONG}": 4 * 4096 + 2 * 9000,
        f"oversized_padded_tokens#{LONG}": 2 * 9000, f"routed_tokens#{LONG}": 30_000,
        f"completed_tokens#{LONG}": 29_000,
    }  # fmt: skip
    view = StatusView(read_ms=NOW, ingest_lag=0, ingest_end=130)
    p0 = "tokenfabric-processor-0"
    view.checkpoints[p0] = checkpoint(p0, counters, consumer=LONG)
    view.checkpoints["tokenfabric-processor-1"] = checkpoint(
        "tokenfabric-processor-1", {"owned_partitions": 3, "ingest_partitions": 6}, age_s=312, consumer=LONG
    )
    view.contracts[LONG] = Contract(LONG, "default", budget_tokens=4096, max_items=16, max_inflight=2)
    view.contracts["gpu-old"] = Contract("gpu-old", "llama-70b", budget_tokens=8192, max_items=32)
    view.announced_ms = {LONG: NOW - 3_600_000, "gpu-old": NOW - 7_200_000}
    view.groups = {LONG: GroupFacts(1, committed=9, end=10, unread=0), "gpu-old": GroupFacts(members=0)}
    return view


def test_dead_instances_and_consumers_are_marked_stale_and_unserved_work_is_named() -> None:
    rep = report(busy_view(), TopicNames(), stale_s=30)
    states = {p.instance: (p.state, round(p.checkpoint_age_s)) for p in rep.processors}
    assert states == {"tokenfabric-processor-0": ("live", 0), "tokenfabric-processor-1": ("stale", 312)}
    consumers = {c.consumer: c for c in rep.consumers}
    assert consumers[LONG].state == "up" and consumers[LONG].last_completion_age_s == pytest.approx(0.4)
    assert consumers["gpu-old"].state == "stale"  # not in its group, last seen two hours ago
    assert [(u.model, u.items, u.tokens, u.consumers) for u in rep.unserved] == [
        ("llama-70b", 100, 40_000, ["gpu-old"])
    ]
    # p1 died holding 3 of the 6 partitions and nobody took them over yet: ingest is stalled there
    assert (rep.ingest.state, rep.ingest.stalled_partitions, rep.ingest.partitions) == ("stalled", 3, 6)
    text = render_text(rep)
    assert "UNSERVED" in text and "llama-70b" in text and "(gpu-old not up)" in text
    assert "STALE" in text
    assert "STALLED: 3 of 6 partitions have no live owner (owner STALE)" in text


def test_a_stale_instances_partitions_count_once_and_show_as_handed_over() -> None:
    view = busy_view()
    live = view.checkpoints["tokenfabric-processor-0"]
    view.checkpoints[live.instance] = replace(live, counters={**live.counters, "owned_partitions": 6})
    rep = report(view, TopicNames(), stale_s=30)
    rows = {p.instance: (p.owned_partitions, p.handed_over) for p in rep.processors}
    assert rows == {"tokenfabric-processor-0": (6, 0), "tokenfabric-processor-1": (0, 3)}
    assert (rep.ingest.state, rep.ingest.stalled_partitions) == ("flowing", 0)
    assert "0/6 partitions (3 handed over)" in render_text(rep)


def test_a_member_answering_nothing_while_batches_wait_is_silent_and_unread_stays_in_the_limit() -> None:
    view = busy_view()
    for name, cp in view.checkpoints.items():  # its last completion 40 s ago, a batch in flight
        quiet = {**cp.per_consumer[LONG], "last_completion_ms": NOW - 40_000}
        view.checkpoints[name] = replace(cp, per_consumer={LONG: quiet})
    view.groups[LONG] = GroupFacts(1, committed=3, end=10, unread=7)  # read apart: more than its limit
    row = next(c for c in report(view, TopicNames(), stale_s=30).consumers if c.consumer == LONG)
    assert row.state == "silent" and row.last_seen_age_s == pytest.approx(40)
    assert row.unread_batches == 2  # its contract's in-flight limit
    assert "SILENT: in its group, batches wait for it, no answer for 40 s" in render_text(
        report(view, TopicNames(), stale_s=30)
    )


def test_budget_fill_leaves_oversized_batches_out_and_never_passes_100_percent() -> None:
    row = next(c for c in report(busy_view(), TopicNames()).consumers if c.consumer == LONG)
    # 8 batches in budget, 4 * 4096 padded tokens: 50%; the 2 oversized (9000 > 4096 each) apart
    assert (row.budget_fill, row.oversized_batches) == (pytest.approx(0.5), 2)
    view = busy_view()
    view.checkpoints["tokenfabric-processor-0"].counters.pop(f"oversized_padded_tokens#{LONG}")
    row = next(c for c in report(view, TopicNames()).consumers if c.consumer == LONG)
    assert row.budget_fill == 1.0  # an older checkpoint without the split: clamped, not 84%+ over


def test_the_text_fits_80_columns_and_cuts_no_id() -> None:
    text = render_text(report(busy_view(), TopicNames()), width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = text.split()
    for name in (LONG, "gpu-old", "tokenfabric-processor-0", "tokenfabric-processor-1", "llama-70b"):
        assert name in words, f"{name} cut or missing"
    assert "…" not in text


def test_fold_never_splits_a_word() -> None:
    line = "  " + " ".join(["word"] * 30) + " " + "x" * 90
    out = fold([line], 40)
    assert all(len(x) <= 40 for x in out[:-1]) and out[-1].strip() == "x" * 90
    assert " ".join(out).split() == line.split()


def test_watch_rates_and_eta() -> None:
    first = report(busy_view(), TopicNames())
    view = busy_view()
    view.read_ms = NOW + 2000
    cp = view.checkpoints["tokenfabric-processor-0"]
    cp.counters.update(received_tokens=110_000, completed_tokens=10_000, queued_tokens=25_000)
    rates = with_rates(report(view, TopicNames()), first).rates
    assert rates is not None
    assert (rates.received_tokens_per_s, rates.completed_tokens_per_s) == (10_000, 5_000)
    assert rates.backlog_tokens == 25_000 and rates.eta_s == pytest.approx(5.0)
    assert "ETA 5.0 s" in render_text(with_rates(report(view, TopicNames()), first))


def test_json_matches_the_documented_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    first = report(busy_view(), TopicNames())
    for rep in (first, with_rates(first, report(StatusView(read_ms=NOW - 2000), TopicNames()))):
        doc = json.loads(json.dumps(rep.as_json()))
        validator.validate(doc)
    # the schema is strict: a field the code adds without documenting it fails
    doc["undocumented"] = 1
    assert not validator.is_valid(doc)
    # and the text shows what the JSON holds
    text = render_text(first)
    for c in doc["consumers"]:
        assert c["consumer"] in text


def test_status_shows_each_jobs_share_and_tokens() -> None:
    """The jobs table (docs/shares.md): weight, quota and cap state, tokens per stage, summed over
    instances; no table when no checkpoint counts a job."""
    from processor.core.accounting import Ledger
    from processor.wire.records import LedgerSnapshotRecord

    assert report(StatusView(), TopicNames()).jobs == []
    ledger = Ledger()
    ledger.job_received("nightly", 3, 300)
    ledger.job_routed("nightly", 2, 200, 256)
    counters = {
        **ledger.snapshot(),
        "job:weight_milli:nightly": 4000,
        "job:max_tokens_per_s:nightly": 5000,
        "job:max_tokens:nightly": -1,
        "job:capped:nightly": 1,
    }
    view = StatusView()
    for name in ("a", "b"):
        view.checkpoints[name] = LedgerSnapshotRecord(
            instance=name, taken_ms=0, sequence=1, counters=counters, per_model={}, per_consumer={}
        )
    assert view.jobs() == ["nightly"]
    assert view.job_total("nightly", "routed_tokens") == 400
    assert view.job_policy("nightly") == (4.0, 5000, -1, True)
    rep = report(view, TopicNames())
    (job,) = rep.jobs
    assert (job.weight, job.max_tokens_per_s, job.max_tokens, job.capped) == (4.0, 5000, None, True)
    assert (job.tokens["received"], job.tokens["routed"], job.tokens["padded"]) == (600, 400, 512)
    row = next(line for line in render_text(rep, width=80).splitlines() if "nightly" in line)
    assert "5,000/s CAPPED" in row and "400" in row and "600" in row
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(
        json.loads(json.dumps(rep.as_json()))
    )


def test_status_shows_the_retried_items_beside_cancelled_and_expired() -> None:
    """Items sent back to the lanes after a retriable failure (the ledger's ``retried``), summed
    over instances, in the text and the JSON."""
    counters = {"received_items": 5, "routed_items": 7, "retried_items": 2, "retried_tokens": 80}
    view = StatusView(read_ms=NOW)
    for name in ("a", "b"):
        view.checkpoints[name] = checkpoint(name, counters)
    rep = report(view, TopicNames())
    assert (rep.ledger["retried"].items, rep.ledger["retried"].tokens) == (4, 160)
    assert rep.as_json()["ledger"]["retried"] == {"items": 4, "tokens": 160}
    (line,) = [line for line in render_text(rep).splitlines() if line.split()[:1] == ["retried"]]
    assert line.split()[1:] == ["4", "160"]


def fleet_view(consumers: int = 64) -> StatusView:
    """Two live processors and ``consumers`` cards of one model, each holding a batch; three of them
    are in trouble: one silent (in its group, batches wait, no answer), two down (out of their group)."""
    view = StatusView(read_ms=NOW, ingest_lag=0, ingest_end=100)
    names = [f"gpu-{n:03d}" for n in range(consumers)]
    per_consumer = {n: {"slots": 2, "in_flight_batches": 1, "last_completion_ms": NOW - 400} for n in names}
    troubled = consumers > 41
    if troubled:
        per_consumer["gpu-007"]["last_completion_ms"] = NOW - 600_000
    for p in ("tokenfabric-processor-0", "tokenfabric-processor-1"):
        counters = {"owned_partitions": 6, "ingest_partitions": 12}
        for n in names:
            counters |= {f"routed_tokens#{n}": 40_000, f"completed_tokens#{n}": 39_000, f"batches#{n}": 10}
            counters |= {f"padded_tokens#{n}": 44_000}
        view.checkpoints[p] = LedgerSnapshotRecord(
            instance=p,
            taken_ms=NOW - 300,
            sequence=1,
            counters=counters,
            per_model={},
            per_consumer=per_consumer,
        )
    for n in names:
        view.contracts[n] = Contract(n, "llama-8b", budget_tokens=8192, max_items=32, max_inflight=4)
        view.announced_ms[n] = NOW - 3_600_000
        view.groups[n] = GroupFacts(1, committed=9, end=10, unread=1)
    if troubled:
        view.groups["gpu-040"] = view.groups["gpu-041"] = GroupFacts(members=0)
        view.announced_ms["gpu-040"] = view.announced_ms["gpu-041"] = NOW - 7_200_000
    return view


def test_status_with_64_consumers_fits_80_columns_and_leads_with_what_needs_attention() -> None:
    rep = report(fleet_view(64), TopicNames(), stale_s=30)
    states = {c.consumer: c.state for c in rep.consumers}
    assert states["gpu-007"] == "silent" and states["gpu-040"] == states["gpu-041"] == "down"
    text = render_text(rep, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    start = next(i for i, line in enumerate(lines) if line.startswith("consumers ("))
    section = lines[start + 1 :]
    assert section[0] == "  64 consumers: 61 up, 1 SILENT, 2 DOWN; 128 of 256 batches in flight"
    # the three in trouble come first, in detail; then one line per consumer that is up
    troubled = [i for i, line in enumerate(section) if line.startswith("  gpu-")]
    assert [section[i].split()[0] for i in troubled] == ["gpu-007", "gpu-040", "gpu-041"]
    table = [line for line in section if line.startswith("    gpu-")]
    assert len(table) == 61 and all("2/4" in line for line in table)  # a batch from each processor
    assert len(section) < 2 * 64  # a line per healthy card, not nine (576 lines before)
    small = render_text(report(fleet_view(4), TopicNames(), stale_s=30), width=80)
    assert small.count("    contract  ") == 4  # a few consumers: every one in detail, as before


def test_group_facts_kafka_never_answers_are_unknown_not_a_traceback_or_an_abort() -> None:
    """``status --watch`` through a broker that answers nothing: each group's facts stay unknown
    (None) within the timeout. A ``TimeoutError`` traceback once ended status here, and the admin
    API's group requests aborted the process (librdkafka#4605): they are not used."""
    import socket

    from processor.ops.status_view import consumer_groups

    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    began = time.monotonic()
    conf = {"bootstrap.servers": f"127.0.0.1:{port}", "log_level": "0"}
    facts = consumer_groups(conf, TopicNames("unit"), ["gpu-a", "gpu-b"], timeout_s=0.5)
    assert set(facts) == {"gpu-a", "gpu-b"}
    assert all(f.members is None and f.committed is None and f.unread is None for f in facts.values())
    assert time.monotonic() - began < 10.0  # bounded by the timeouts, not hung
