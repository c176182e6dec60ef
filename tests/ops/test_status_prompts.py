"""``status``'s prompt figures: completed prompt tokens served from the prefix cache or computed,
summed over checkpoints, per consumer and per job, in text and JSON; "not counted" while a checkpoint
carries no prompt counters."""

from __future__ import annotations

import json

import jsonschema

from processor.cli.status import render_text
from processor.core.contract import Contract
from processor.kafka.topics import TopicNames
from processor.ops.status import SCHEMA_PATH, StatusView, report
from processor.wire.records import LedgerSnapshotRecord

NOW = 1_800_000_000_000


def _view(*counters: dict[str, int]) -> StatusView:
    view = StatusView(read_ms=NOW)
    view.contracts["gpu"] = Contract("gpu", "m", budget_tokens=4096, max_items=16)
    for n, c in enumerate(counters):
        view.checkpoints[f"p{n}"] = LedgerSnapshotRecord(
            instance=f"p{n}", taken_ms=NOW - 100, sequence=1, counters=c, per_model={}, per_consumer={}
        )
    return view


def _counted(cached: int, prefill: int) -> dict[str, int]:
    return {
        "completed_items": 4, "completed_tokens": cached + prefill,
        "cached_prompt_tokens": cached, "prefill_tokens": prefill,
        "cached_prompt_tokens#gpu": cached, "prefill_tokens#gpu": prefill,
        "job:completed_tokens:j": cached + prefill,
        "job:cached_prompt_tokens:j": cached, "job:prefill_tokens:j": prefill,
    }  # fmt: skip


def test_the_instances_prompt_counts_add_up_with_their_share() -> None:
    rep = report(_view(_counted(300, 100), _counted(0, 100)), TopicNames())
    assert (rep.prompts.counted, rep.prompts.cached_tokens, rep.prompts.prefill_tokens) == (True, 300, 200)
    assert rep.prompts.cached_share == 0.6
    (row,) = rep.consumers
    assert (row.prompts.cached_tokens, row.prompts.prefill_tokens) == (300, 200)
    (job,) = rep.jobs
    assert (job.tokens["cached_prompt"], job.tokens["prefill"]) == (300, 200)
    text = render_text(rep, width=120)
    assert "prompts  300 tokens from the prefix cache, 200 computed (60.0% cached)" in text
    assert "    prompts   300 tokens from the prefix cache, 200 computed (60.0% cached)" in text
    doc = json.loads(json.dumps(rep.as_json()))
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(doc)
    assert doc["prompts"] == {
        "counted": True,
        "cached_tokens": 300,
        "prefill_tokens": 200,
        "cached_share": 0.6,
    }


def test_a_checkpoint_without_prompt_counters_makes_the_figures_not_counted() -> None:
    """An earlier processor's checkpoint claims nothing about the cache: zeros would read as a
    measurement of "nothing cached", so none is shown."""
    old = {"completed_items": 4, "completed_tokens": 200}
    rep = report(_view(_counted(300, 100), old), TopicNames())
    assert rep.prompts.counted is False and rep.prompts.cached_share is None
    assert (rep.prompts.cached_tokens, rep.prompts.prefill_tokens) == (0, 0)
    assert "prompts  not counted" in render_text(rep, width=120)
