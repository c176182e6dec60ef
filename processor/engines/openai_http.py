"""``openai``: run batches on an OpenAI-compatible generation server (vLLM, SGLang, llama.cpp) over HTTP.

Prompts go as token ids, not text. The processor groups items by a signature over their token ids, so
re-tokenizing text on the server could split a shared prefix differently and undo what the lanes
bought; the completions API takes ``prompt`` as a list of token-id lists, which the server runs as
they are. See docs/engine-openai.md for setup against a server.

What each item asks: its generation request (``TokenItem.request``) becomes body fields in the
spelling of the server named by the ``server`` option (processor/engines/generation.py); an item
asking for what that server cannot be told is ``rejected`` without a request.

Requests (``requests`` option):

* ``item`` (the default): one ``POST /v1/completions`` per item, up to ``concurrency`` of them at
  once. The API reports ``usage`` per request, not per prompt (llama.cpp's server even reports the
  first prompt's usage only for a request of several), so this is what gives each item its own
  measured ``cached_tokens`` and exact ``output_tokens``. The server's continuous batching runs the
  concurrent requests together, and its prefix cache serves what they share.
* ``settings``: one request per group of items whose request bodies are equal but for the prompt
  (same settings, same ``max_tokens``), all their prompts in one list; groups concurrently, up to
  ``concurrency``. Usage per request only.
* ``budget``: the same groups, one after the other (with no item carrying a request a group is a
  distinct ``max_tokens``: what ``budget`` always meant).

One deadline per batch (``deadline_s``) keeps :meth:`run` inside the poll interval whatever the
retries and splits do. A request the server refuses with 400/413/422 (something in its body, which
one prompt can cause) is split in halves until the refused prompts are alone (processor/engines/isolate.py):
the other items complete. 401/403/404, 429, 5xx and connection failures fail the request's items at
once, without splitting.

Results, per item: ``ok`` only for an item with a choice in a successful response, matched by index
(processor/engines/openai_choices.py); ``rejected`` for a prompt the server refused alone with
400/413/422 (``HTTP 400: <the server's message>``: the same body would be refused again, so neither
the pipeline nor ``submit --retry-failed`` runs it again), for an ``output_budget`` below 1 or a
request the server cannot be told; ``failed`` with the status or error, the server's message and the
attempts. No reason names the endpoint: reasons reach output files a job's user reads, and the
server's address is the operator's business. ``run`` never raises for a server problem: other
requests of the same batch may have succeeded, and a reason per item is more useful than one
exception text.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from processor.core.serving import split_serving_key
from processor.engines.base import Engine, ItemResult
from processor.engines.generation import Unsupported, dialect
from processor.engines.isolate import Refusal, belongs_to_a_prompt, isolate
from processor.engines.openai_choices import cached_prompt_tokens, item_result, map_choices
from processor.engines.openai_options import OPTIONS, OpenAISettings, parse_options
from processor.engines.slot_affinity import SlotAffinity
from processor.engines.tls import tls_context, tls_refusal
from processor.wire.records import BatchRecord, TokenItemRecord

__all__ = [
    "OPTIONS",
    "OpenAICompletionsEngine",
    "OpenAISettings",
    "cached_prompt_tokens",
    "from_options",
    "parse_options",
]

#: Characters of an error body (or of the server's message in it) quoted in a reason.
BODY_SNIPPET_CHARS = 200


class _RequestFailed(Exception):
    """Internal: a request failed for good; the text is every item's reason. ``retriable``: it gave
    up on what may pass later (timeouts, 429, 5xx, a server gone away), so the pipeline may retry."""

    retriable = False


class _Refused(_RequestFailed):
    """Internal: the server refused the request with a status that may be one prompt's fault."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True, slots=True)
class _Request:
    """One server request's body but for its prompts, and the positions of the batch's items in it."""

    body: dict[str, Any]
    positions: list[int]


class OpenAICompletionsEngine(Engine):
    """Sends each batch's prompts as token ids to ``/v1/completions``; see the module docstring.

    ``sleep``, ``clock`` and ``rng`` are injected so tests can record backoffs, move a fake clock past
    the deadline and get the same jitter every run. With ``requests=item`` or ``settings`` they are
    called from up to ``concurrency`` threads of the engine's own pool (created at the first batch,
    shut in :meth:`close`).
    """

    name = "openai"

    def __init__(
        self,
        settings: OpenAISettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._dialect = dialect(settings.server, settings.lora_ids)
        parts = urllib.parse.urlsplit(settings.endpoint)
        self._https = parts.scheme == "https"
        self._tls = tls_context(settings.tls) if self._https else None
        self._netloc = parts.netloc
        self._target = parts.path + (f"?{parts.query}" if parts.query else "")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"
        self._pool: ThreadPoolExecutor | None = None
        self._slots = SlotAffinity(settings.slot_affinity) if settings.slot_affinity else None

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        deadline = self._clock() + self.settings.deadline_s
        results: list[ItemResult | None] = [None] * len(batch.items)
        requests = self._plan(batch, results)

        def send(request: _Request) -> list[ItemResult]:
            return self._run_request(request.body, [batch.items[i] for i in request.positions], deadline)

        if len(requests) > 1 and self.settings.requests != "budget":
            answers = list(self._threads().map(send, requests))
        else:
            answers = [send(request) for request in requests]
        for request, answer in zip(requests, answers, strict=True):
            for i, result in zip(request.positions, answer, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def _plan(self, batch: BatchRecord, results: list[ItemResult | None]) -> list[_Request]:
        """The batch's requests; an item that cannot be sent gets its ``rejected`` result here.

        Items whose bodies are equal but for the prompt share a request unless ``requests=item``.
        The served model is the ``model`` option, else the batch's model without its adapter (the
        serving key ``model@adapter``: the adapter goes in the dialect's own field).
        """
        s = self.settings
        model = s.model or split_serving_key(batch.model)[0]
        by_body: dict[str, _Request] = {}
        requests: list[_Request] = []
        for i, item in enumerate(batch.items):
            max_tokens = s.max_tokens if item.output_budget is None else item.output_budget
            if max_tokens < 1:
                results[i] = item_result(item, "rejected", f"output_budget={max_tokens}: the API needs >= 1")
                continue
            try:
                fields = self._dialect.fields(item.request, temperature=s.temperature)
            except Unsupported as exc:
                results[i] = item_result(item, "rejected", str(exc))
                continue
            body = {"model": model, "max_tokens": max_tokens, "n": 1, "stream": False, **fields}
            body.update(self._placement(item))
            if s.requests == "item":
                requests.append(_Request(body, [i]))
                continue
            key = json.dumps(body, sort_keys=True)
            if key not in by_body:
                by_body[key] = _Request(body, [])
                requests.append(by_body[key])
            by_body[key].positions.append(i)
        return requests

    def _placement(self, item: TokenItemRecord) -> dict[str, Any]:
        """``ignore_eos`` and llama.cpp's ``id_slot`` (the slot of the item's shape), when enabled."""
        out: dict[str, Any] = {"ignore_eos": True} if self.settings.ignore_eos else {}
        if self._slots is not None:
            out["id_slot"] = self._slots.slot(item.shape)
        return out

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="openai-engine")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _run_request(
        self, body: dict[str, Any], items: list[TokenItemRecord], deadline: float
    ) -> list[ItemResult]:
        """``items`` in one request of ``body``, split until refused prompts are alone (isolate.py)."""
        max_tokens: int = body["max_tokens"]
        json_output = self.settings.output == "json"

        def send(part: Sequence[TokenItemRecord]) -> list[ItemResult] | Refusal:
            payload = {**body, "prompt": [item.token_ids().tolist() for item in part]}
            try:
                response = self._post(json.dumps(payload).encode("utf-8"), deadline)
            except _Refused as exc:
                return Refusal(exc.status, str(exc))
            except _RequestFailed as exc:
                return [item_result(item, "failed", str(exc), exc.retriable) for item in part]
            return map_choices(part, response, max_tokens, json_output=json_output)

        def refused(item: TokenItemRecord, refusal: Refusal, sent: int) -> ItemResult:
            # the server refused this prompt alone: the same body would be refused again, so the
            # item is rejected (never retried, in the pipeline or by submit --retry-failed)
            alone = f" (isolated from a request of {sent} prompts)" if sent > 1 else ""
            return item_result(item, "rejected", refusal.reason + alone)

        return isolate(items, send, refused)

    def _post(self, body: bytes, deadline: float) -> dict[str, Any]:
        """The parsed JSON of a 2xx response, retrying what may pass; else :class:`_RequestFailed`."""
        s = self.settings
        last = "not sent"
        attempts = 0
        while True:
            remaining_s = deadline - self._clock()
            if remaining_s <= 0:
                raise self._gave_up(last, attempts, "deadline_s passed")
            attempts += 1
            retry_after_s: float | None = None
            try:
                status, retry_after, data = self._send(body, min(s.timeout_s, remaining_s))
            except TimeoutError:
                last = f"no response within {min(s.timeout_s, remaining_s):g} s"
            except (OSError, http.client.HTTPException) as exc:
                refused = tls_refusal(exc, presented_cert=self.settings.tls.cert_file is not None)
                if refused is not None:
                    raise _RequestFailed(f"{refused} (not retried)") from None
                last = f"{type(exc).__name__}: {exc}"
            else:
                if 200 <= status < 300:
                    return _parse_response(data)
                last = f"HTTP {status}: {_server_message(data)}"
                if belongs_to_a_prompt(status):
                    raise _Refused(status, f"{last} (not retried)")
                if not (status == 429 or status >= 500):
                    raise _RequestFailed(f"{last} (not retried)")
                retry_after_s = _retry_after_s(retry_after)
            if attempts > s.retries:
                raise self._gave_up(last, attempts, f"retries={s.retries} exhausted")
            delay_s = self._backoff_s(attempts - 1, retry_after_s)
            if self._clock() + delay_s >= deadline:
                raise self._gave_up(last, attempts, "deadline_s would pass before the next attempt")
            self._sleep(delay_s)

    def _send(self, body: bytes, timeout_s: float) -> tuple[int, str | None, bytes]:
        """One POST on a fresh connection (no keep-alive to go stale between batches, no env proxies)."""
        conn: http.client.HTTPConnection
        if self._tls is not None:
            conn = http.client.HTTPSConnection(self._netloc, timeout=timeout_s, context=self._tls)
        else:
            conn = http.client.HTTPConnection(self._netloc, timeout=timeout_s)
        try:
            conn.request("POST", self._target, body=body, headers=self._headers)
            response = conn.getresponse()
            return response.status, response.getheader("Retry-After"), response.read()
        finally:
            conn.close()

    def _backoff_s(self, retry: int, retry_after_s: float | None) -> float:
        """``backoff_ms * 2**retry`` capped at ``backoff_max_ms``, times a jitter in [0.5, 1).

        A server's ``Retry-After`` lengthens the wait, still within the cap: the deadline decides.
        """
        s = self.settings
        cap_ms = min(s.backoff_max_ms, s.backoff_ms * 2.0 ** min(retry, 60))
        delay_ms = cap_ms * (0.5 + 0.5 * self._rng.random())
        if retry_after_s is not None:
            delay_ms = max(delay_ms, min(retry_after_s * 1000.0, s.backoff_max_ms))
        return delay_ms / 1000.0

    def _gave_up(self, last: str, attempts: int, why: str) -> _RequestFailed:
        failed = _RequestFailed(f"{last} (gave up after {attempts} attempt(s): {why})")
        failed.retriable = True
        return failed


def _parse_response(data: bytes) -> dict[str, Any]:
    try:
        response = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _RequestFailed(f"2xx body is not JSON: {_snippet(data)} (not retried)") from None
    if not isinstance(response, dict) or not isinstance(response.get("choices"), list):
        raise _RequestFailed(f"2xx body has no choices list: {_snippet(data)} (not retried)")
    return response


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header in its delay-seconds form; an HTTP date is ignored."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _snippet(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip().replace("\n", " ")
    return (text[:BODY_SNIPPET_CHARS] + "...") if len(text) > BODY_SNIPPET_CHARS else text or "(empty body)"


def _server_message(data: bytes) -> str:
    """The server's own message in an error body (``error.message``: OpenAI, llama.cpp, newer vLLM;
    ``message``: vLLM, SGLang), else the body, cut to :data:`BODY_SNIPPET_CHARS`."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return _snippet(data)
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if message is None and isinstance(body, dict):
        message = body.get("message")
    return _snippet(message.encode("utf-8")) if isinstance(message, str) and message else _snippet(data)


def from_options(options: dict[str, str]) -> OpenAICompletionsEngine:
    """Build from ``--engine-opt KEY=VALUE`` strings; see :func:`parse_options`."""
    return OpenAICompletionsEngine(parse_options(options))
