"""The main job, small: both runs (tokenfabric and the plain queue) on the broker, and the report's
numbers checked against what the topics hold, read here independently of processor.local.compare."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from processor.cli.tokenfabric import main
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.wire.completions import decode_completions
from processor.wire.items import decode_token_item

pytestmark = pytest.mark.kafka

ITEMS = 120


def _topics_say(bootstrap: str, prefix: str) -> dict[str, float]:
    conf = {"bootstrap.servers": bootstrap}
    topics = TopicNames(prefix)
    shape, produced = {}, []
    for msg in read_topic(conf, topics.ingest):
        rec = decode_token_item(msg.value())
        shape[rec.item_id] = rec.shape
        produced.append(rec.produced_ms)
    done: dict[str, int] = defaultdict(int)
    batches: dict[str, list] = defaultdict(list)
    for msg in read_topic(conf, topics.results):
        for rec in decode_completions(msg.value()):
            done[rec.item_id] += 1
            batches[rec.batch_id].append(rec)
    real = sum(r.input_tokens for recs in batches.values() for r in recs)
    padded = sum(len(recs) * recs[0].padded_tokens for recs in batches.values())
    last = max(r.completed_ms for recs in batches.values() for r in recs)
    return {
        "items": len(shape),
        "items_completed_once": sum(1 for i in shape if done.get(i) == 1),
        "batches": len(batches),
        "padding_waste": 1 - real / padded,
        "makespan_s": (last - min(produced)) / 1000,
        "mixed_shape_batches": sum(
            1 for recs in batches.values() if len({shape[r.item_id] for r in recs}) > 1
        ),
    }


def test_both_runs_complete_every_item_once_and_the_report_matches_the_topics(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    code = main(
        ["demo", "--engine", "sim", "--time-scale", "0", "--limit", str(ITEMS), "--plot", "",
         "--json", str(out), "--bootstrap", kafka_bootstrap]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "plain queue" in printed and "tokenfabric / plain" in printed
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"tokenfabric", "plain-queue"}
    for name, run in runs.items():
        seen = _topics_say(kafka_bootstrap, run["topic_prefix"])
        assert run["engine"] == "sim" and run["audit_clean"] is True, name
        assert run["items"] == seen["items"] == ITEMS
        assert run["items_completed_once"] == seen["items_completed_once"] == ITEMS
        assert run["batches"] == seen["batches"]
        assert run["padding_waste"] == pytest.approx(seen["padding_waste"], abs=1e-6)
        assert run["makespan_s"] == pytest.approx(seen["makespan_s"], abs=1e-3)
        assert run["mixed_shape_batches"] == seen["mixed_shape_batches"]
        for key in ("real_tokens_per_s", "budget_fill", "shape_switches", "cache_hit_rate"):
            assert key in run
    tf, pq = runs["tokenfabric"], runs["plain-queue"]
    assert tf["mixed_shape_batches"] == 0 < pq["mixed_shape_batches"]  # lanes never mix shapes
    assert tf["padding_waste"] < pq["padding_waste"]
