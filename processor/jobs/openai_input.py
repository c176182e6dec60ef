"""The OpenAI batch input format: one request per JSONL line, read as a job's rows by ``submit``.

Each line is ``{"custom_id": ..., "method": "POST", "url": "/v1/completions" | "/v1/chat/completions"
| "/v1/embeddings", "body": {...}}`` (the OpenAI Batch API's and vLLM ``run-batch``'s input). Lines
are read through the ordinary :class:`~processor.jobs.datasets.Dataset`, so row ``n`` is the
``n``-th non-blank line and the item id is ``<job>:<row>`` like every job's. The ``custom_id``
stays where it is, in the input row: ``collect`` re-reads the dataset to join results, and
:func:`custom_id_of` gives it back for the OpenAI output file.

How a body maps to an item (docs/jobs.md has the table): ``prompt`` (a string, or a list of token ids,
or a list of one string) or ``messages`` (rendered with the chat template) is the prompt; ``model`` the
job's model (``--model``, else the first line's; a line naming another model names a LoRA adapter of it,
as vLLM serves adapters by name: processor/jobs/prepare.py OpenAIRows); ``max_tokens`` /
``max_completion_tokens`` the output budget; ``temperature``, ``top_p``, ``seed``, ``stop``,
``logprobs`` / ``top_logprobs`` and ``response_format`` (``json_schema``, ``json_object``) the request's
fields, as do vLLM's ``top_k``, ``stop_token_ids``, ``priority``, ``guided_json``, ``guided_choice`` and
``guided_regex``; every other key goes to the request's ``extra`` (passed to the server as it is). ``n``
other than 1 and ``stream: true`` are refused: a row has one result, written once. An embeddings line's
``input`` (one text, or one list of token ids) is the prompt of an item an embed consumer runs;
``encoding_format`` other than ``float``, and keys other than ``model``, ``input``, ``encoding_format``
and ``user``, are refused.

A line that cannot be used is a bad row with the reason, as in any job: not JSON, no or an empty
``custom_id``, a ``custom_id`` seen on an earlier line (:class:`CustomIds`), a method other than
POST, an unsupported ``url``, no ``body``, no prompt, invalid settings.

Pure: no Kafka, no files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from processor.jobs.chat import check_messages
from processor.jobs.model import JobRecord
from processor.jobs.settings import OUTPUT_BUDGET_KEY, Settings, SettingsError, parse_settings
from processor.jobs.templates import RowError

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
ENDPOINTS = (COMPLETIONS, CHAT_COMPLETIONS, EMBEDDINGS)
#: Body keys of an embeddings line (``user`` is OpenAI's end-user tag: accepted, not used).
_EMBEDDING_KEYS = frozenset({"model", "input", "encoding_format", "user"})
#: ``JobRecord.template`` of a job submitted from an OpenAI batch input: this, then the chat
#: template's path (empty when no line needed one).
TEMPLATE_PREFIX = "openai-batch:"
#: Body keys with the same name and meaning as a settings key.
_SAME_NAME = ("temperature", "top_p", "seed", "stop", "top_k", "stop_token_ids", "priority", "adapter")
#: vLLM's guided-decoding keys, and the settings key each becomes.
_GUIDED = {"guided_json": "json_schema", "guided_choice": "choices", "guided_regex": "regex"}
#: Body keys that are the prompt or the model, not settings.
_PROMPT_KEYS = ("model", "prompt", "messages")
_BUDGET_KEYS = ("max_completion_tokens", "max_tokens")
_HANDLED = frozenset(
    (
        *_SAME_NAME,
        *_GUIDED,
        *_PROMPT_KEYS,
        *_BUDGET_KEYS,
        "logprobs",
        "top_logprobs",
        "response_format",
        "n",
        "stream",
    )
)


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    """One usable input line: exactly one of ``prompt``, ``prompt_ids`` and ``messages`` is set."""

    custom_id: str
    url: str
    model: str | None
    settings: Settings = field(default_factory=dict)
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    messages: list[dict[str, Any]] | None = None


def custom_id_of(values: Mapping[str, Any] | None) -> str | None:
    """The ``custom_id`` of an input row (DatasetRow.values), or None when it has no string one."""
    value = None if values is None else values.get("custom_id")
    return value if isinstance(value, str) else None


def endpoint_of(values: Mapping[str, Any] | None) -> str | None:
    """The row's ``url`` when it is one tokenfabric runs, else None."""
    value = None if values is None else values.get("url")
    return value if value in ENDPOINTS else None


def is_openai_job(record: JobRecord) -> bool:
    """Whether ``record``'s job was submitted from an OpenAI batch input file."""
    return record.template.startswith(TEMPLATE_PREFIX)


def job_template_field(chat_template: str | None) -> str:
    """``JobRecord.template`` for an OpenAI input job (see :data:`TEMPLATE_PREFIX`)."""
    return TEMPLATE_PREFIX + (chat_template or "")


def looks_like_openai_batch(values: Mapping[str, Any] | None) -> bool:
    """Whether a first data row is an OpenAI batch input line (``submit --input-format auto``)."""
    return values is not None and "custom_id" in values and "body" in values


class CustomIds:
    """The custom ids seen so far: the first line with an id owns it (even a line that is bad for
    another reason), and any later line with it is bad, so each custom_id has one result."""

    def __init__(self) -> None:
        self._rows: dict[str, int] = {}

    def claim(self, custom_id: str, row: int) -> None:
        first = self._rows.setdefault(custom_id, row)
        if first != row:
            raise RowError(f"duplicate custom_id {custom_id!r} (first at row {first})")


def parse_line(values: Mapping[str, Any]) -> OpenAIRequest:
    """One input line as a request; RowError with the reason the line is bad (module docstring)."""
    custom_id = values.get("custom_id")
    if custom_id is None:
        raise RowError("missing custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise RowError("custom_id must be a non-empty string")
    if values.get("method") != "POST":
        raise RowError(f"method {values.get('method')!r}: the batch API takes POST")
    url = values.get("url")
    if url not in ENDPOINTS:
        raise RowError(f"unsupported url {url!r} (tokenfabric runs {', '.join(ENDPOINTS)})")
    body = values.get("body")
    if body is None:
        raise RowError("missing body")
    if not isinstance(body, dict):
        raise RowError("body must be a JSON object")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise RowError("body.model must be a non-empty string")
    if url == EMBEDDINGS:
        return _embedding(custom_id, body, model)
    try:
        settings = body_settings(body)
    except SettingsError as exc:
        raise RowError(f"body: {exc}") from None
    if url == CHAT_COMPLETIONS:
        if "prompt" in body:
            raise RowError(f"body.prompt belongs to {COMPLETIONS}; {CHAT_COMPLETIONS} takes messages")
        if body.get("messages") is None:
            raise RowError("body has no messages")
        return OpenAIRequest(custom_id, url, model, settings, messages=check_messages(body["messages"]))
    if "messages" in body:
        raise RowError(f"body.messages belong to {CHAT_COMPLETIONS}; {COMPLETIONS} takes a prompt")
    prompt, ids = _prompt(body.get("prompt"))
    return OpenAIRequest(custom_id, url, model, settings, prompt=prompt, prompt_ids=ids)


def _embedding(custom_id: str, body: Mapping[str, Any], model: str | None) -> OpenAIRequest:
    """An embeddings line: one ``input`` (text or token ids), embedded by an embed consumer
    (processor/engines/embed.py); its vector comes back as a list of floats."""
    unknown = sorted(set(body) - _EMBEDDING_KEYS)
    if unknown:
        raise RowError(f"body.{unknown[0]}: an embeddings line takes {', '.join(sorted(_EMBEDDING_KEYS))}")
    if body.get("encoding_format", "float") != "float":
        raise RowError(
            f"encoding_format {body['encoding_format']!r}: tokenfabric writes embeddings as floats"
        )
    value = body.get("input")
    if value is None:
        raise RowError("body has no input")
    try:
        prompt, ids = _prompt(value)
    except RowError as exc:
        raise RowError(str(exc).replace("prompt", "input")) from None
    return OpenAIRequest(custom_id, EMBEDDINGS, model, prompt=prompt, prompt_ids=ids)


def _prompt(value: Any) -> tuple[str | None, tuple[int, ...] | None]:
    """A completions prompt: a string, one string in a list, or a list of token ids."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise RowError("body.prompt is empty")
        return value, None
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        if any(not 0 <= t < 2**32 for t in value):
            raise RowError("body.prompt has a token id outside 0..2^32-1")
        return None, tuple(value)
    if value is None:
        raise RowError("body has no prompt")
    raise RowError("body.prompt must be a string or a list of token ids (one prompt per line)")


def body_settings(body: Mapping[str, Any]) -> Settings:
    """The settings a body asks for, in tokenfabric's names (module docstring); SettingsError."""
    if body.get("n", 1) != 1:
        raise SettingsError(f"n={body['n']!r}: a batch row has one result; send n lines instead")
    if body.get("stream"):
        raise SettingsError("stream: a batch row's result is written once, not streamed")
    out: dict[str, Any] = {k: body[k] for k in _SAME_NAME if body.get(k) is not None}
    out.update({ours: body[theirs] for theirs, ours in _GUIDED.items() if body.get(theirs) is not None})
    budget = next((body[k] for k in _BUDGET_KEYS if body.get(k) is not None), None)
    if budget is not None:
        out[OUTPUT_BUDGET_KEY] = budget
    logprobs = _logprobs(body)
    if logprobs is not None:
        out["logprobs"] = logprobs
    schema = _response_schema(body.get("response_format"))
    if schema is not None:
        out["json_schema"] = schema
    extra = {k: v for k, v in body.items() if k not in _HANDLED}
    if extra:
        out["extra"] = extra
    return parse_settings(out)


def _logprobs(body: Mapping[str, Any]) -> Any:
    """Completions: ``logprobs`` is the number of alternatives. Chat: ``logprobs`` is a boolean and
    ``top_logprobs`` the number (0 when absent)."""
    value = body.get("logprobs")
    if isinstance(value, bool):
        return body.get("top_logprobs") or 0 if value else None
    return value


def _response_schema(value: Any) -> Any:
    """The JSON schema ``response_format`` asks for: ``json_schema.schema``, or any object for
    ``json_object``; None for ``text`` or none."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise SettingsError("response_format json_schema has no 'schema' object")
        return schema
    raise SettingsError(f"response_format type {kind!r}: use text, json_object or json_schema")
