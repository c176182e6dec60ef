"""A completions response mapped to one result per item: choices matched by index, output token counts,
cached prompt tokens, and the item's output as text or as a JSON object.

The rules (docs/engine-openai.md, "Matching"): an item is ``ok`` only with exactly one choice carrying
its index, whose ``text`` is a string and whose ``finish_reason`` is not ``abort``/``error``; usage is
the request's, so it is one item's only when the request carried one prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from processor.engines.base import ItemResult
from processor.wire.records import TokenItemRecord

#: ``finish_reason`` values that mean the server gave up on the sequence (vLLM: ``abort``).
FAILED_FINISH_REASONS = frozenset({"abort", "error"})


def map_choices(
    items: Sequence[TokenItemRecord], response: dict[str, Any], max_tokens: int, *, json_output: bool = False
) -> list[ItemResult]:
    """One result per item from the choices of one response, matched by ``index``."""
    by_index: dict[int, dict[str, Any]] = {}
    duplicated: set[int] = set()
    for choice in response["choices"]:
        index = choice.get("index") if isinstance(choice, dict) else None
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(items):
            if index in by_index:
                duplicated.add(index)
            by_index[index] = choice
    raw_usage = response.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    request_cached = cached_prompt_tokens(response)
    cache_hit = request_cached > 0
    # usage is the request's: it is one item's only when the request carried one prompt
    cached = min(request_cached, items[0].token_count) if len(items) == 1 else 0
    usable: list[dict[str, Any] | None] = []
    results: list[ItemResult | None] = []
    for i, item in enumerate(items):
        choice = by_index.get(i)
        problem = _choice_problem(i, choice, i in duplicated, len(items))
        usable.append(None if problem else choice)
        results.append(item_result(item, "failed", problem) if problem else None)
    counts = _output_token_counts(usable, usage.get("completion_tokens"), max_tokens)
    for i, (item, choice, count) in enumerate(zip(items, usable, counts, strict=True)):
        if choice is not None:
            output = _output(item, choice, count, json_output)
            results[i] = ItemResult(item.item_id, "ok", output, count, None, cache_hit, cached)
    return [r for r in results if r is not None]


def _choice_problem(index: int, choice: dict[str, Any] | None, duplicated: bool, sent: int) -> str | None:
    if choice is None:
        return f"server returned no choice with index {index} ({sent} prompts sent)"
    if duplicated:
        return f"server returned more than one choice with index {index}"
    if not isinstance(choice.get("text"), str):
        return f"choice {index} has no text"
    if choice.get("finish_reason") in FAILED_FINISH_REASONS:
        return f"server finished choice {index} with finish_reason={choice['finish_reason']!r}"
    return None


def _text(choice: dict[str, Any] | None) -> bytes:
    return b"" if choice is None else str(choice["text"]).encode("utf-8")


#: Item metadata asking for the JSON object output (``submit`` sets it on OpenAI batch lines, whose
#: output file carries the server's ``finish_reason``).
OUTPUT_METADATA_KEY = "output"


def wants_json(item: TokenItemRecord, json_output: bool) -> bool:
    """Whether ``item``'s output is the JSON object: the ``output=json`` option, the item's metadata
    ``output=json`` (an OpenAI batch line's), or its request asks for logprobs (which have no place
    in a bare text)."""
    if json_output or (item.request is not None and item.request.logprobs is not None):
        return True
    return item.metadata is not None and item.metadata.get(OUTPUT_METADATA_KEY) == "json"


def _output(item: TokenItemRecord, choice: dict[str, Any], output_tokens: int, json_output: bool) -> bytes:
    """The completion's output: the choice's text as UTF-8, or (:func:`wants_json`) the JSON object
    ``{"text", "finish_reason", "output_tokens", "logprobs"}``, ``logprobs`` as the server gave them
    (each server has its own shape; null when it sent none)."""
    if not wants_json(item, json_output):
        return _text(choice)
    document = {
        "text": choice["text"],
        "finish_reason": choice.get("finish_reason"),
        "output_tokens": output_tokens,
        "logprobs": choice.get("logprobs"),
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _output_token_counts(
    choices: Sequence[dict[str, Any] | None], completion_tokens: object, max_tokens: int
) -> list[int]:
    """Generated tokens per choice: exact where the choice tells, the rest of ``usage`` split by text.

    Exact: ``len(token_ids)`` when the server returns them, ``max_tokens`` when ``finish_reason`` is
    ``length``. The API reports ``completion_tokens`` per request only, so the other choices share what
    is left of it in proportion to their UTF-8 text length; without usage they count 0.
    """
    counts = [0] * len(choices)
    unknown: list[int] = []
    for i, choice in enumerate(choices):
        if choice is None:
            continue
        if isinstance(choice.get("token_ids"), list):
            counts[i] = len(choice["token_ids"])
        elif choice.get("finish_reason") == "length":
            counts[i] = max_tokens
        else:
            unknown.append(i)
    if unknown and isinstance(completion_tokens, int) and not isinstance(completion_tokens, bool):
        left = max(0, completion_tokens - sum(counts))
        weights = [len(_text(choices[i])) for i in unknown]
        for i, share in zip(unknown, _split(left, weights), strict=True):
            counts[i] = share
    return counts


def _split(total: int, weights: list[int]) -> list[int]:
    """``total`` in whole parts proportional to ``weights`` (equal if all 0), summing to ``total``."""
    if not any(weights):
        weights = [1] * len(weights)
    whole = sum(weights)
    parts = [total * w // whole for w in weights]
    by_remainder = sorted(range(len(weights)), key=lambda i: -(total * weights[i] % whole))
    for i in by_remainder[: total - sum(parts)]:
        parts[i] += 1
    return parts


def cached_prompt_tokens(response: dict[str, Any]) -> int:
    """The prompt tokens a completions response says the server took from its prefix cache; 0 if none.

    ``usage.prompt_tokens_details.cached_tokens`` is the OpenAI field: vLLM sends it when started with
    ``--enable-prompt-tokens-details``, SGLang with ``--enable-cache-report``, llama.cpp's server always.
    Otherwise llama.cpp's own ``timings.cache_n`` (the same figure). Not ``tokens_cached``: llama.cpp
    counts the slot's whole cached sequence there, generated tokens included (docs/engine-openai.md).
    """
    usage = response.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is None:
        timings = response.get("timings")
        cached = _count(timings.get("cache_n")) if isinstance(timings, dict) else None
    return cached or 0


def _count(value: object) -> int | None:
    """``value`` if it is a count (an int >= 0, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def item_result(
    item: TokenItemRecord, status: Literal["failed", "rejected"], reason: str, retriable: bool = False
) -> ItemResult:
    """A result that is not ``ok``: no output, no tokens, the reason (``retriable``: ``ItemResult``'s)."""
    return ItemResult(item.item_id, status, b"", 0, reason, False, 0, retriable and status == "failed")
