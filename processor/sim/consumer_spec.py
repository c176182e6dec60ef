"""A simulated consumer: its contract and card, as ``--consumer NAME:key=value,...`` writes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processor.core.contract import Contract
from processor.core.serving import SEPARATOR, serving_key
from processor.sim.cardmodel import CardSpec


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    contract: Contract
    card: CardSpec
    server: str = ""
    """The card this consumer shares with the others naming it ("": a card of its own): several
    adapters on one server are several consumers against it (docs/consumers.md, Adapters)."""


DEFAULT_CONSUMERS = (
    # A 16 GB card: room for 16k padded tokens per forward pass.
    "card16:model=default,budget=16384,items=64,pad=8,inflight=2,tps=25000,overhead_ms=5,cache=4",
    # A 32 GB card: twice the budget and about twice the speed.
    "card32:model=default,budget=32768,items=128,pad=8,inflight=2,tps=50000,overhead_ms=5,cache=4",
)

_INT_KEYS = {
    "budget": "budget_tokens",
    "items": "max_items",
    "pad": "pad_multiple",
    "inflight": "max_inflight",
    "memory_bytes": "memory_bytes",
    "kv_bytes_per_token": "kv_bytes_per_token",
    "default_output_tokens": "default_output_tokens",
}

_CARD_KEYS = {"tps": "tokens_per_s", "overhead_ms": "overhead_ms", "cache": "cache", "jitter": "jitter"}


def parse_consumer_spec(text: str, defaults: Mapping[str, Any] | None = None) -> ConsumerSpec:
    """``NAME:model=M,budget=16384,items=64,pad=8,inflight=2,tps=50000,overhead_ms=5,cache=4``, plus
    ``batching=rows|tokens|memory``, ``memory_bytes``, ``kv_bytes_per_token`` and
    ``default_output_tokens``, ``adapter=A`` (the one LoRA adapter of the model it serves: its
    contract's model is ``M@A``) and ``server=S`` (the card it shares with the consumers naming S).
    ``defaults`` (contract field -> value, from the command line's ``--batching`` and its numbers)
    apply where the spec does not name the key."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise ValueError(
            f"--consumer {text!r}: expected NAME:key=value,... (e.g. card16:model=default,budget=16384)"
        )
    contract_args: dict[str, Any] = {"consumer": name, "model": "default"}
    card_args: dict[str, Any] = {}
    placing = {"adapter": "", "server": ""}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"--consumer {text!r}: {part!r} is not key=value")
        try:
            if key in ("model", "batching"):
                contract_args[key] = value
            elif key in placing:
                placing[key] = value
            elif key in _INT_KEYS:
                contract_args[_INT_KEYS[key]] = int(value)
            elif key in _CARD_KEYS:
                card_args[_CARD_KEYS[key]] = int(value) if key == "cache" else float(value)
            else:
                known = ", ".join(["model", "batching", *placing, *_INT_KEYS, *_CARD_KEYS])
                raise ValueError(f"--consumer {text!r}: unknown key {key!r} (known: {known})")
        except ValueError as exc:
            if "unknown key" in str(exc):
                raise
            raise ValueError(f"--consumer {text!r}: {key}={value!r} is not a number") from None
    for key in ("model", "adapter"):
        if SEPARATOR in (contract_args if key == "model" else placing)[key]:
            raise ValueError(f"--consumer {text!r}: {key} must not contain {SEPARATOR!r}")
    contract_args["model"] = serving_key(contract_args["model"], placing["adapter"])
    base = {"budget_tokens": 16384, "max_items": 64, "pad_multiple": 8, "max_inflight": 2}
    try:
        contract = Contract(**{**base, **(defaults or {}), **contract_args})
        card = CardSpec(**card_args)
    except ValueError as exc:
        raise ValueError(f"--consumer {text!r}: {exc}") from None
    return ConsumerSpec(contract, card, placing["server"])
