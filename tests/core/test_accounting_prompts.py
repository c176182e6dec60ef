"""The ledger's third equation: a completed prompt was served from the prefix cache or computed.

``completed_tokens = cached_prompt_tokens + prefill_tokens`` per model, consumer and job, with the
cached counts summing to one total across the three, through a checkpoint and back, and from a
checkpoint written before prompts were counted.
"""

from __future__ import annotations

import pytest

from processor.core.accounting import Ledger, LedgerImbalance, prompt_split


def served_ledger() -> Ledger:
    """Two models, two consumers, two jobs; some prompts served from the cache, one batch failed."""
    ledger = Ledger()
    for model, job, tokens in (("alpha", "j1", 100), ("alpha", "j1", 200), ("beta", "j2", 300)):
        ledger.received(model, tokens)
        ledger.job_received(job, 1, tokens)
    ledger.routed("alpha", "card-1", 2, 300, 400, False)
    ledger.job_routed("j1", 2, 300, 400)
    ledger.routed("beta", "card-2", 1, 300, 300, False)
    ledger.job_routed("j2", 1, 300, 300)
    ledger.finished("alpha", "card-1", 2, 300, 0, 0, cached_tokens=250)
    ledger.job_finished("j1", 2, 300, 0, 0, cached_tokens=250)
    ledger.finished("beta", "card-2", 0, 0, 1, 300, cached_tokens=0)
    ledger.job_finished("j2", 0, 0, 1, 300, cached_tokens=0)
    return ledger


def test_cached_and_computed_prompt_tokens_add_up_to_the_completed_ones_everywhere() -> None:
    ledger = served_ledger()
    ledger.check()
    ledger.check_jobs()
    alpha, card1, j1 = ledger.models["alpha"], ledger.consumers["card-1"], ledger.jobs["j1"]
    assert (alpha.cached_prompt_tokens, alpha.prefill_tokens) == (250, 50)
    assert (card1.cached_prompt_tokens, card1.prefill_tokens) == (250, 50)
    assert (j1.cached_prompt_tokens, j1.prefill_tokens) == (250, 50)
    beta = ledger.models["beta"]  # a failed batch: no prompt completed, nothing counted
    assert (beta.cached_prompt_tokens, beta.prefill_tokens) == (0, 0)


def test_an_answer_without_a_cached_count_counts_its_whole_prompt_as_computed() -> None:
    ledger = Ledger()
    ledger.received("m", 40)
    ledger.routed("m", "c", 1, 40, 40, False)
    ledger.finished("m", "c", 1, 40, 0, 0, cached_tokens=0)
    assert (ledger.models["m"].cached_prompt_tokens, ledger.models["m"].prefill_tokens) == (0, 40)
    assert ledger.prompts_counted and ledger.snapshot()["prefill_tokens"] == 40
    ledger.check()


@pytest.mark.parametrize(
    ("reported", "split"), [(-5, (0, 10)), (0, (0, 10)), (7, (7, 3)), (10, (10, 0)), (99, (10, 0))]
)
def test_a_reported_count_is_held_to_the_prompt(reported: int, split: tuple[int, int]) -> None:
    assert prompt_split(10, reported) == split


def test_the_counts_survive_a_checkpoint() -> None:
    ledger = served_ledger()
    snapshot = ledger.snapshot()
    assert (snapshot["cached_prompt_tokens"], snapshot["prefill_tokens"]) == (250, 50)
    assert snapshot["cached_prompt_tokens@alpha"] == 250 and snapshot["prefill_tokens#card-1"] == 50
    assert snapshot["job:cached_prompt_tokens:j1"] == 250
    restored = Ledger.restore(snapshot)
    assert restored.prompts_counted and restored.snapshot() == snapshot
    restored.check()
    restored.check_jobs()


def test_a_caller_that_passes_no_counts_balances_but_claims_nothing_about_the_cache() -> None:
    """The scheduler of an earlier version calls ``finished`` without ``cached_tokens``."""
    ledger = Ledger()
    ledger.received("m", 40)
    ledger.routed("m", "c", 1, 40, 40, False)
    ledger.finished("m", "c", 1, 40, 0, 0)
    ledger.job_finished("", 1, 40, 0, 0)
    assert (ledger.models["m"].cached_prompt_tokens, ledger.models["m"].prefill_tokens) == (0, 40)
    ledger.check()
    snapshot = ledger.snapshot()
    assert not ledger.prompts_counted
    assert not [k for k in snapshot if "prompt" in k or "prefill" in k]
    restored = Ledger.restore(snapshot)
    assert not restored.prompts_counted and restored.models["m"].prefill_tokens == 40
    restored.check()


def test_a_checkpoint_from_before_prompts_were_counted_restores_them_as_computed() -> None:
    old = {k: v for k, v in served_ledger().snapshot().items() if "prompt" not in k and "prefill" not in k}
    restored = Ledger.restore(old)
    assert not restored.prompts_counted
    restored.check()
    restored.check_jobs()
    assert (
        restored.models["alpha"].prefill_tokens == 300 and restored.models["alpha"].cached_prompt_tokens == 0
    )
    assert restored.jobs["j1"].prefill_tokens == 300


def test_a_book_whose_prompts_do_not_add_up_is_out_of_balance() -> None:
    ledger = served_ledger()
    ledger.models["alpha"].prefill_tokens += 1
    with pytest.raises(LedgerImbalance, match="model alpha out of balance: completed 2 items / 300 tokens"):
        ledger.check()


def test_the_consumers_cached_counts_must_sum_to_the_models() -> None:
    ledger = served_ledger()
    ledger.consumers["card-1"].cached_prompt_tokens -= 10
    ledger.consumers["card-1"].prefill_tokens += 10
    with pytest.raises(
        LedgerImbalance,
        match="cached_prompt by model 0 items / 250 tokens, cached_prompt by consumer 0 items / 240",
    ):
        ledger.check()


def test_the_jobs_cached_counts_must_sum_to_the_models() -> None:
    ledger = served_ledger()
    ledger.jobs["j1"].cached_prompt_tokens -= 10
    ledger.jobs["j1"].prefill_tokens += 10
    with pytest.raises(LedgerImbalance, match="cached_prompt by job 0 items / 240"):
        ledger.check_jobs()
