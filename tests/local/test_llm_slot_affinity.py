"""Shape-to-slot affinity against a real llama-server: each shape's items run in the slot that holds
its prefix (``id_slot``), so the server serves the prefix from cache for every item but the shape's
first; without affinity, concurrent items of one shape land on different slots and each computes it.

Also: ``ignore_eos`` holds each item to its output budget (the server reports ``length``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.cli.llm import main as llm_main
from processor.engines.openai_http import OpenAICompletionsEngine, parse_options
from processor.local.llm.build import build_server
from processor.local.llm.model import ensure_model
from processor.local.llm.server import server_status
from processor.wire.records import BatchRecord, TokenItemRecord, tokens_from_ids

pytestmark = pytest.mark.llm

NAME = "pytest-slots"
SLOTS = 4
PREFIX = 96
"""Prefix ids each shape's items share; the user parts are 8 ids of their own."""
BUDGET = 5


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    build_server(progress=print)
    ensure_model()
    home: Path = tmp_path_factory.mktemp("slots-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOKENFABRIC_HOME", str(home))
        argv = ["--slots", str(SLOTS), "--ctx-tokens", str(SLOTS * 512), "--threads", "1"]
        assert llm_main(["start", "--name", NAME, *argv]) == 0
        info = server_status(NAME)
        assert info is not None
        try:
            yield info.url
        finally:
            llm_main(["stop", "--name", NAME])


def _batch(shapes: list[int], salt: int) -> BatchRecord:
    """Items of the given shapes, interleaved; a shape's items share its prefix ids."""
    items = []
    for n, shape in enumerate(shapes):
        prefix = random.Random(shape * 1000 + salt).sample(range(2000, 30000), PREFIX)
        user = random.Random(f"{salt}-{n}").sample(range(2000, 30000), 8)
        ids = [101, *prefix, *user]
        items.append(
            TokenItemRecord(
                item_id=f"i{n}",
                model="m",
                shape=shape,
                token_count=len(ids),
                tokens=tokens_from_ids(ids),
                produced_ms=0,
                output_budget=BUDGET,
            )
        )
    return BatchRecord(
        batch_id=f"b{salt}", consumer="c", model="m", shape=shapes[0], lane=0,
        padded_length=PREFIX + 9, pad_multiple=1, created_ms=0, items=items,
    )  # fmt: skip


def _cached(url: str, work: BatchRecord, **options: str) -> list[int]:
    settings = parse_options({"url": url, "server": "llamacpp", "output": "json", **options})
    engine = OpenAICompletionsEngine(settings)
    try:
        results = engine.run(work)
    finally:
        engine.close()
    assert [r.status for r in results] == ["ok"] * len(work.items), [r.reason for r in results]
    assert all(r.output_tokens == BUDGET for r in results)  # held to the budget
    return [r.cached_tokens for r in results]


def test_each_shapes_items_run_in_the_slot_that_holds_its_prefix(url: str) -> None:
    shapes = [1, 2, 1, 2, 1, 2, 1, 2]  # two shapes, four items each, sent concurrently
    cached = _cached(url, _batch(shapes, salt=1), ignore_eos="true", slot_affinity=str(SLOTS))
    for shape in (1, 2):  # every item of the shape but its first found the prefix in its slot
        mine = [c for c, s in zip(cached, shapes, strict=True) if s == shape]
        assert sum(c >= PREFIX for c in mine) == len(mine) - 1, (shape, cached)


def test_without_affinity_concurrent_items_of_a_shape_compute_its_prefix_in_several_slots(url: str) -> None:
    held = _cached(url, _batch([4, 4, 4, 4], salt=2), ignore_eos="true", slot_affinity=str(SLOTS))
    assert sum(c >= PREFIX for c in held) == 3, held
    # Concurrency is the premise: on a loaded machine the four requests can reach the server one
    # after another, and then each finds the prefix in the last one's slot (a CI rehearsal saw
    # [0, 97, 97, 97]). Up to three tries, each with a prefix of its own; one must show the spread.
    seen = []
    for salt in (2, 3, 4):
        without = _cached(url, _batch([3, 3, 3, 3], salt=salt), ignore_eos="true")
        seen.append(without)
        if sum(c >= PREFIX for c in without) < 3:
            return
    raise AssertionError(f"every try found the prefix cached three times without affinity: {seen}")
