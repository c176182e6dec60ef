"""The demo's read-back of measured cache use: cached and computed prompt tokens per card and run."""

from __future__ import annotations

from processor.local.compare import RunFigures, _batch, _card
from processor.wire.records import CompletionRecord


def _done(item_id: str, status: str, tokens: int, cached: int, output: int = 3) -> CompletionRecord:
    return CompletionRecord(
        item_id=item_id, batch_id="b1", consumer="card", model="m", status=status,  # type: ignore[arg-type]
        input_tokens=tokens, output_tokens=output if status == "ok" else 0, padded_tokens=tokens,
        completed_ms=10, cached_tokens=cached,
    )  # fmt: skip


def test_a_batchs_ok_items_split_their_prompts_into_cached_and_computed() -> None:
    recs = [_done("a", "ok", 100, 90), _done("b", "ok", 100, 250), _done("c", "failed", 100, 0)]
    b = _batch("b1", recs, {"a": 1, "b": 1, "c": 1})
    assert (b.cached_prompt_tokens, b.prefill_tokens, b.output_tokens) == (190, 10, 6)  # 250 held to 100


def test_the_run_reports_the_measured_cached_share_beside_the_modelled_hit_rate() -> None:
    run = RunFigures("openai")
    run.cards["card"] = _card([_batch("b1", [_done("a", "ok", 100, 75)], {"a": 1})], 400, 4)
    d = run.to_dict()
    assert (d["cached_prompt_tokens"], d["prefill_tokens"], d["output_tokens"]) == (75, 25, 3)
    assert d["cached_prompt_share"] == 0.75
    assert d["cards"]["card"]["cached_prompt_tokens"] == 75
    assert RunFigures("embed").to_dict()["cached_prompt_share"] is None  # nothing completed
