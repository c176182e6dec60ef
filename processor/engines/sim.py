"""``sim``: an engine that costs what :class:`~processor.sim.cardmodel.CardModel` says and computes nothing.

It lets the whole pipeline run, end to end on real Kafka, on a machine with no GPU: the consumer app
sleeps for the modelled forward-pass time of each batch, so the processor sees a consumer with the
throughput and prefix-cache behaviour of the card it announced, and the demo's figures can be compared
with ``tokenfabric simulate`` on the same trace. ``time_scale`` shrinks (or stretches) the sleep so a
demo over a long trace finishes quickly; ``0`` makes every batch instant (tests).

Output is deterministic: ``b"sim:" + item_id`` and the item's ``output_budget`` as the output token
count (or 1-64 from a hash of the id when the item has none), so a replay gives the same completions.
"""

from __future__ import annotations

import time

import xxhash

from processor.engines.base import Engine, ItemResult
from processor.sim.cardmodel import CardModel, CardSpec
from processor.wire.records import BatchRecord, TokenItemRecord


class SimEngine(Engine):
    """Sleeps ``CardModel.batch_ms(padded tokens) * time_scale`` ms per batch; reports cache hits."""

    name = "sim"

    def __init__(self, card: CardSpec, time_scale: float = 1.0, seed: int = 0) -> None:
        if not time_scale >= 0:  # also refuses NaN
            raise ValueError(f"time_scale must be >= 0, got {time_scale}")
        self.card = card
        self.time_scale = time_scale
        self.model = CardModel(card, seed)
        #: Modelled milliseconds of the last batch, before ``time_scale`` (for tests and logs).
        self.last_batch_ms = 0.0

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        padded_tokens = batch.padded_length * len(batch.items)
        self.last_batch_ms = self.model.batch_ms(padded_tokens)
        hit = self.model.cache.serve([batch.shape])
        delay_s = self.last_batch_ms * self.time_scale / 1000.0
        if delay_s > 0:
            time.sleep(delay_s)
        return [
            ItemResult(
                item.item_id, "ok", b"sim:" + item.item_id.encode("utf-8"), _output_tokens(item), None, hit
            )
            for item in batch.items
        ]


def _output_tokens(item: TokenItemRecord) -> int:
    if item.output_budget is not None and item.output_budget >= 0:
        return item.output_budget
    return 1 + xxhash.xxh3_64_intdigest(item.item_id.encode("utf-8")) % 64


OPTIONS = ("tps", "overhead_ms", "cache", "jitter", "time_scale", "seed")


def from_options(options: dict[str, str]) -> SimEngine:
    """Build from strings: ``tps``, ``overhead_ms``, ``cache``, ``jitter``, ``time_scale``, ``seed``.

    Missing keys take :class:`CardSpec`'s defaults (``time_scale`` 1, ``seed`` 0). Raises
    ``ValueError`` with one line naming the bad option.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"sim engine: unknown option(s) {', '.join(unknown)} (known: {', '.join(OPTIONS)})")
    d = CardSpec()
    try:
        card = CardSpec(
            tokens_per_s=_float(options, "tps", d.tokens_per_s),
            overhead_ms=_float(options, "overhead_ms", d.overhead_ms),
            cache=_int(options, "cache", d.cache),
            jitter=_float(options, "jitter", d.jitter),
        )
    except ValueError as exc:
        raise ValueError(f"sim engine: {exc}") from None
    return SimEngine(card, time_scale=_float(options, "time_scale", 1.0), seed=_int(options, "seed", 0))


def _float(options: dict[str, str], key: str, default: float) -> float:
    if key not in options:
        return default
    try:
        return float(options[key])
    except ValueError:
        raise ValueError(f"sim engine: {key}={options[key]!r} is not a number") from None


def _int(options: dict[str, str], key: str, default: int) -> int:
    if key not in options:
        return default
    try:
        return int(options[key])
    except ValueError:
        raise ValueError(f"sim engine: {key}={options[key]!r} is not an integer") from None
