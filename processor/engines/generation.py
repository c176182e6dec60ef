"""What an item's generation request becomes in the body of one server's ``POST /v1/completions``.

Why a module of its own: the OpenAI completions API names temperature, top_p, seed, stop and logprobs
the same everywhere, but top_k, stop token ids, structured output, LoRA adapters and priority each
server spells its own way (vLLM before 0.12 ``guided_json``, vLLM 0.12 and later
``structured_outputs``, SGLang ``json_schema``/``regex``/``ebnf``, llama.cpp ``json_schema``/
``grammar`` and a ``lora`` list by adapter id). A :class:`Dialect` per server (the ``server`` engine
option) holds one server's spelling; the engine asks it for an item's fields and never branches on
the server. The table, and where each name was read, is in docs/engine-openai.md.

Invariants:

* :meth:`Dialect.fields` returns every setting the item asks for, in the server's form, or raises
  :class:`Unsupported` with a one-line reason: an item is never sent with a setting silently dropped.
  The one exception is ``priority``, a scheduling hint: servers without priority scheduling are not
  sent it (the processor does not depend on it either).
* Equal requests give equal fields (the fields are a function of the request and the dialect), so the
  engine groups items whose fields are equal into one multi-prompt request.
* ``extra`` is merged last and may override any field except the ones the engine owns
  (:data:`ENGINE_FIELDS`): the prompt, ``n``, ``stream``, ``echo`` and ``max_tokens`` (the item's
  ``output_budget``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from processor.wire.request import GenerationRequest, request_problem

ServerName = Literal["openai", "vllm", "vllm-guided", "sglang", "llamacpp"]
SERVERS: tuple[ServerName, ...] = ("openai", "vllm", "vllm-guided", "sglang", "llamacpp")
DEFAULT_SERVER: ServerName = "openai"
"""Only fields of OpenAI's own completions API: never a field another server would misread. An item
asking for more is rejected with a reason that names the ``server`` option (docs/engine-openai.md)."""

ENGINE_FIELDS = frozenset({"prompt", "n", "stream", "echo", "max_tokens"})
"""Body fields the engine sets and ``extra`` may not override: the engine matches choices to prompts
by index (one choice per prompt) and counts output tokens against ``max_tokens``."""

JSON_SCHEMA_NAME = "output"
"""The ``name`` OpenAI's ``response_format`` requires beside a JSON schema."""


class Unsupported(ValueError):
    """The item asks for something its server cannot be told; the text is the item's reason. The
    engine rejects the item without a request."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """One server's spelling of the settings the OpenAI completions API does not name.

    ``top_k_off`` is the server's value for "no top-k limit" (the request's ``top_k=0``); None when the
    server takes no ``top_k``. ``lora_ids`` (llama.cpp only) maps adapter names to the ids of the
    adapters the server loaded (``--lora``, in order from 0).
    """

    name: ServerName
    top_k_off: int | None
    stop_token_ids: bool
    priority: bool
    adapter_as: Literal["model", "lora_path", "lora"]
    """``model``: the adapter's name as the served model (vLLM, OpenAI); ``lora_path``: SGLang's field;
    ``lora``: llama.cpp's list of adapter ids and scales."""
    logprobs_as: Literal["logprobs", "n_probs"] = "logprobs"
    """llama.cpp's ``n_probs`` returns nothing at 0, so 0 is sent as 1 there."""
    lora_ids: Mapping[str, int] = field(default_factory=dict)

    def fields(self, request: GenerationRequest | None, *, temperature: float) -> dict[str, Any]:
        """The body fields for ``request`` (None: the consumer's defaults), ``extra`` merged last.

        ``temperature`` is the consumer's default, sent when the request names none. Raises
        :class:`Unsupported` for a setting this server cannot be told, or an invalid request.
        """
        out: dict[str, Any] = {"temperature": temperature}
        if request is None:
            out.update(self._adapter(""))
            return out
        problem = request_problem(request)
        if problem is not None:
            raise Unsupported(f"invalid request: {problem}")
        r = request
        if r.temperature is not None:
            out["temperature"] = r.temperature
        if r.top_p is not None:
            out["top_p"] = r.top_p
        if r.seed is not None:
            out["seed"] = r.seed
        if r.stop:
            out["stop"] = list(r.stop)
        if r.top_k is not None:
            out["top_k"] = self._top_k(r.top_k)
        if r.stop_token_ids:
            if not self.stop_token_ids:
                raise self._cannot("stop_token_ids")
            out["stop_token_ids"] = list(r.stop_token_ids)
        if r.logprobs is not None:
            out.update(self._logprobs(r.logprobs))
        constraint = r.constraint
        if constraint is not None:
            out.update(self._constraint(*constraint))
        out.update(self._adapter(r.adapter))
        if r.priority and self.priority:
            out["priority"] = r.priority
        if r.extra is not None:
            out.update(_extra(r.extra))
        return out

    def _cannot(self, setting: str) -> Unsupported:
        able = [d.name for d in DIALECTS.values() if _takes(d, setting)]
        return Unsupported(
            f"{setting} cannot be sent to server={self.name}"
            + (f" (servers that take it: {', '.join(able)}; engine option server=...)" if able else "")
        )

    def _top_k(self, top_k: int) -> int:
        if self.top_k_off is None:
            raise self._cannot("top_k")
        return top_k if top_k > 0 else self.top_k_off

    def _logprobs(self, logprobs: int) -> dict[str, Any]:
        if self.logprobs_as == "n_probs":
            return {"n_probs": max(1, logprobs)}
        return {"logprobs": logprobs}

    def _constraint(self, kind: str, value: str | tuple[str, ...]) -> dict[str, Any]:
        spelling = _CONSTRAINTS[self.name].get(kind)
        if spelling is None:
            raise self._cannot(kind)
        return spelling(value)

    def _adapter(self, adapter: str) -> dict[str, Any]:
        if self.adapter_as == "lora":
            return self._llamacpp_lora(adapter)
        return {self.adapter_as: adapter} if adapter else {}

    def _llamacpp_lora(self, adapter: str) -> dict[str, Any]:
        """llama.cpp applies its adapters at their start-up scales to a request without ``lora``, so a
        base-model request lists every known adapter at scale 0 and an adapter's request its own at 1
        (adapters not listed get 0)."""
        if not adapter:
            off = [{"id": i, "scale": 0.0} for i in sorted(set(self.lora_ids.values()))]
            return {"lora": off} if off else {}
        if adapter not in self.lora_ids:
            known = ", ".join(sorted(self.lora_ids)) or "none"
            raise Unsupported(
                f"adapter {adapter!r} has no llama.cpp adapter id (engine option lora_ids; known: {known})"
            )
        return {"lora": [{"id": self.lora_ids[adapter], "scale": 1.0}]}


def _takes(dialect: Dialect, setting: str) -> bool:
    if setting == "top_k":
        return dialect.top_k_off is not None
    if setting == "stop_token_ids":
        return dialect.stop_token_ids
    return setting in _CONSTRAINTS[dialect.name]


def _extra(text: str) -> dict[str, Any]:
    extra: dict[str, Any] = json.loads(text)  # request_problem checked it is an object
    owned = sorted(ENGINE_FIELDS & set(extra))
    if owned:
        raise Unsupported(f"extra sets {', '.join(owned)}, which the engine sets itself")
    return extra


def choices_grammar(choices: tuple[str, ...]) -> str:
    """A GBNF grammar (llama.cpp's, which SGLang's XGrammar backend also reads as ``ebnf``) whose
    only sentences are ``choices``: ``root ::= "a" | "b"``."""
    return "root ::= " + " | ".join(_gbnf_literal(c) for c in choices)


def _gbnf_literal(text: str) -> str:
    escaped = []
    for ch in text:
        if ch in '"\\':
            escaped.append("\\" + ch)
        elif ch == "\n":
            escaped.append("\\n")
        elif ch == "\r":
            escaped.append("\\r")
        elif ch == "\t":
            escaped.append("\\t")
        elif ord(ch) < 0x20:
            escaped.append(f"\\x{ord(ch):02x}")
        else:
            escaped.append(ch)
    return '"' + "".join(escaped) + '"'


def _schema(value: str | tuple[str, ...]) -> Any:
    return json.loads(str(value))


_Spelling = Callable[[Any], dict[str, Any]]
"""A constraint's value (the schema's JSON text, the choices, the regex) -> the body fields."""

_CONSTRAINTS: dict[ServerName, dict[str, _Spelling]] = {
    "openai": {
        "json_schema": lambda v: {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": JSON_SCHEMA_NAME, "schema": _schema(v), "strict": True},
            }
        },
    },
    "vllm": {
        "json_schema": lambda v: {"structured_outputs": {"json": _schema(v)}},
        "choices": lambda v: {"structured_outputs": {"choice": list(v)}},
        "regex": lambda v: {"structured_outputs": {"regex": v}},
    },
    "vllm-guided": {
        "json_schema": lambda v: {"guided_json": _schema(v)},
        "choices": lambda v: {"guided_choice": list(v)},
        "regex": lambda v: {"guided_regex": v},
    },
    "sglang": {
        "json_schema": lambda v: {"json_schema": v},
        "choices": lambda v: {"ebnf": choices_grammar(tuple(v))},
        "regex": lambda v: {"regex": v},
    },
    "llamacpp": {
        "json_schema": lambda v: {"json_schema": _schema(v)},
        "choices": lambda v: {"grammar": choices_grammar(tuple(v))},
    },
}
"""Each server's structured-output fields by constraint kind; a kind missing here cannot be sent."""

DIALECTS: dict[ServerName, Dialect] = {
    "openai": Dialect("openai", None, stop_token_ids=False, priority=False, adapter_as="model"),
    "vllm": Dialect("vllm", -1, stop_token_ids=True, priority=True, adapter_as="model"),
    "vllm-guided": Dialect("vllm-guided", -1, stop_token_ids=True, priority=True, adapter_as="model"),
    "sglang": Dialect("sglang", -1, stop_token_ids=True, priority=True, adapter_as="lora_path"),
    "llamacpp": Dialect(
        "llamacpp", 0, stop_token_ids=False, priority=False, adapter_as="lora", logprobs_as="n_probs"
    ),
}
"""The dialects without per-consumer settings; :func:`dialect` adds llama.cpp's adapter ids."""


def dialect(server: ServerName, lora_ids: Mapping[str, int] | None = None) -> Dialect:
    """The dialect of ``server``; ``lora_ids`` only for llama.cpp (adapter name -> its id)."""
    base = DIALECTS[server]
    return dataclasses.replace(base, lora_ids=dict(lora_ids)) if lora_ids else base
