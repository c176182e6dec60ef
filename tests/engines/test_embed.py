"""The ``embed`` engine: all-MiniLM-L6-v2 in numpy gives the model's embeddings, whatever the padding.

No Kafka: batches are built as :class:`~processor.wire.records.BatchRecord` values and handed to the engine,
as the consumer app would after decoding them. Texts are short so the file runs in seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from processor.engines.base import ItemResult, make_engine
from processor.engines.embed import EmbedEngine, from_options
from processor.engines.minilm import MiniLM, tokenize
from processor.wire.records import BatchRecord, TokenItemRecord, tokens_from_ids

PARAPHRASES = [
    ("The new movie is awesome", "The new movie is so great"),
    ("A man is eating food.", "A man is eating a piece of bread."),
    ("How do I bake sourdough bread?", "What is a good recipe for sourdough?"),
]
UNRELATED = "Kafka partitions are replicated across brokers."


@pytest.fixture(scope="module")
def engine() -> EmbedEngine:
    return from_options({})


def make_batch(id_lists: list[list[int]], padded_length: int, pad_multiple: int = 8) -> BatchRecord:
    items = [
        TokenItemRecord(
            item_id=f"item-{i}",
            model="all-MiniLM-L6-v2",
            shape=7,
            token_count=len(ids),
            tokens=tokens_from_ids(ids),
            produced_ms=0,
        )
        for i, ids in enumerate(id_lists)
    ]
    return BatchRecord(
        batch_id="b-1",
        consumer="cpu",
        model="all-MiniLM-L6-v2",
        shape=7,
        lane=0,
        padded_length=padded_length,
        pad_multiple=pad_multiple,
        created_ms=0,
        items=items,
    )


def vectors(results: list[ItemResult]) -> np.ndarray:
    return np.stack([np.frombuffer(r.output, dtype="<f4") for r in results])


def embed_alone(engine: EmbedEngine, ids: list[int]) -> np.ndarray:
    """The item in a batch of its own, padded only to the next multiple of 8."""
    (result,) = engine.run(make_batch([ids], -(-len(ids) // 8) * 8))
    assert result.status == "ok"
    return np.frombuffer(result.output, dtype="<f4")


# -- the model card's behaviour ------------------------------------------------------------------


def test_hello_world_matches_the_published_reference_vector(engine: EmbedEngine) -> None:
    # First five components of "hello world" from qdrant/fastembed's CANONICAL_VECTOR_VALUES
    # (tests/test_text_onnx_embeddings.py, ONNX export of the same model, mean pooled, normalised).
    (ids,) = tokenize(["hello world"])
    assert ids == [101, 7592, 2088, 102]
    got = embed_alone(engine, ids)
    np.testing.assert_allclose(got[:5], [-0.034478, 0.03102, 0.00673, 0.02611, -0.039362], atol=1e-5)


def test_paraphrases_are_close_and_unrelated_sentences_are_not(engine: EmbedEngine) -> None:
    texts = [t for pair in PARAPHRASES for t in pair] + [UNRELATED]
    ids = tokenize(texts)
    results = engine.run(make_batch(ids, -(-max(map(len, ids)) // 8) * 8))
    emb = vectors(results)
    assert emb.shape == (7, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    cos = emb @ emb.T
    for i in range(len(PARAPHRASES)):
        a, b = 2 * i, 2 * i + 1
        assert cos[a, b] > 0.65, (texts[a], texts[b], cos[a, b])
        for other in range(len(texts)):
            if other not in (a, b):  # the paraphrase is each sentence's nearest neighbour, by a margin
                assert cos[a, b] > cos[a, other] + 0.3, (texts[a], texts[other], cos[a, other])
        assert abs(cos[a, 6]) < 0.2 and abs(cos[b, 6]) < 0.2
    assert 0.85 < cos[0, 1] < 0.93  # sentence-transformers' docs give 0.894 for this pair


# -- padding and the attention mask ----------------------------------------------------------------


def test_an_item_padded_inside_a_longer_batch_keeps_its_embedding(engine: EmbedEngine) -> None:
    short, long = tokenize(["A man is eating food.", " ".join(["the cat sat on the mat"] * 8)])
    alone = embed_alone(engine, short)
    results = engine.run(make_batch([long, short], 64))
    assert engine.last_padded_tokens == 128  # both rows computed at 64 positions, padding included
    np.testing.assert_allclose(vectors(results)[1], alone, atol=1e-5)
    far = engine.run(make_batch([short], 256))  # 248 padding tokens, all masked
    np.testing.assert_allclose(vectors(far)[0], alone, atol=1e-5)


def test_the_mask_is_what_makes_padding_harmless() -> None:
    # Without the mask, padding tokens would be attended to: the same rows give another embedding.
    model = MiniLM()
    (ids,) = tokenize(["A man is eating food."])
    padded = np.zeros((1, 64), dtype=np.int64)
    padded[0, : len(ids)] = ids
    masked = model.embed(padded, padded != 0)
    unmasked = model.embed(padded, np.ones_like(padded))
    assert np.abs(masked - unmasked).max() > 1e-2


# -- the engine contract ---------------------------------------------------------------------------


def test_one_result_per_item_in_order_with_refusals_named(engine: EmbedEngine) -> None:
    good = tokenize(["hello world", "flag embedding"])
    batch = make_batch([good[0], [101, 40_000, 102], [], good[1]], 8)
    results = engine.run(batch)
    assert [r.item_id for r in results] == [it.item_id for it in batch.items]
    assert [r.status for r in results] == ["ok", "rejected", "rejected", "ok"]
    assert "40,000" in (results[1].reason or "") and "vocabulary" in (results[1].reason or "")
    assert "no tokens" in (results[2].reason or "")
    for r in (results[0], results[3]):
        assert len(r.output) == 384 * 4 and r.output_tokens == 0 and not r.cache_hit and r.reason is None
    for r in (results[1], results[2]):
        assert r.output == b"" and r.output_tokens == 0
    np.testing.assert_allclose(vectors([results[3]])[0], embed_alone(engine, good[1]), atol=1e-5)


def test_prompts_over_512_tokens_are_rejected_not_truncated(engine: EmbedEngine) -> None:
    (short,) = tokenize(["A man is eating food."])
    oversize = [101] + [1996] * 598 + [102]  # 600 tokens: "the" x 598
    results = engine.run(make_batch([short, oversize], 600))
    assert results[0].status == "ok"
    assert results[1].status == "rejected"
    assert "600 tokens exceeds the model's 512 positions" in (results[1].reason or "")
    assert engine.last_padded_tokens == 512  # the rest ran at the model's 512 positions, not 600
    np.testing.assert_allclose(vectors(results[:1])[0], embed_alone(engine, short), atol=1e-5)


def test_an_item_longer_than_the_batch_padded_length_is_rejected(engine: EmbedEngine) -> None:
    (ids,) = tokenize(["A man is eating a piece of bread."])
    (result,) = engine.run(make_batch([ids], 8))
    assert result.status == "rejected"
    assert f"{len(ids)} tokens is longer than the batch's padded_length 8" in (result.reason or "")


def test_options_build_the_engine_or_name_what_is_wrong(tmp_path: Path) -> None:
    assert isinstance(make_engine("embed", {}), EmbedEngine)
    with pytest.raises(ValueError, match=r"^embed engine: unknown option\(s\) threads \(known: model_dir\)$"):
        from_options({"threads": "2"})
    with pytest.raises(
        ValueError, match=r"^embed engine: model_dir='.*': model directory .*: no config\.json$"
    ):
        from_options({"model_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="model_dir is empty"):
        from_options({"model_dir": " "})
    with pytest.raises(ValueError, match=r"^embed engine: unknown option\(s\) bogus, other ") as info:
        from_options({"bogus": "1", "other": "2"})
    assert "\n" not in str(info.value)
