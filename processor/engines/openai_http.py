"""``openai``: run batches on an OpenAI-compatible generation server (vLLM, SGLang, TGI) over HTTP.

Prompts go as token ids, not text. The processor groups items by a signature over their token ids, so
re-tokenizing text on the server could split a shared prefix differently and undo what the lanes
bought; the completions API takes ``prompt`` as a list of token-id lists, which the server runs as
they are. See docs/engine-openai.md for setup against a server.

Requests (``requests`` option):

* ``item`` (the default): one ``POST /v1/completions`` per item, up to ``concurrency`` of them at
  once. The API reports ``usage`` per request, not per prompt (llama.cpp's server even reports the
  first prompt's usage only for a request of several), so this is what gives each item its own
  measured ``cached_tokens`` and exact ``output_tokens``. The server's continuous batching runs the
  concurrent requests together, and its prefix cache serves what they share.
* ``budget``: one request per group of items that share a ``max_tokens`` (an item's
  ``output_budget``, else the ``max_tokens`` option), all their prompts in one list: one request per
  batch in the common case, usage per request only. Groups run one after the other.

Either way one deadline per batch (``deadline_s``) keeps :meth:`run` inside the poll interval
whatever the retries do.

Cached prompt tokens come from ``usage.prompt_tokens_details.cached_tokens`` (vLLM with
``--enable-prompt-tokens-details``, SGLang with ``--enable-cache-report``, llama.cpp's server), else
from llama.cpp's ``timings.cache_n``; a request of several prompts gives none per item.

Results, per item:

* ``ok`` only for an item that has a choice in a successful response (matched by ``choices[i].index``,
  never by position): ``output`` is the choice's text as UTF-8.
* ``failed`` when its choice is missing, duplicated, has no text or finished with ``abort``/``error``,
  or when its group's request failed: a non-retriable status (4xx other than 429, 3xx, a 200 whose
  body is not a completions response) or retries exhausted on timeouts, connection errors, 429 and
  5xx. The reason names the endpoint, the last error and the number of attempts.
* ``rejected``, without a request, for an item the API cannot take: an ``output_budget`` below 1.

``run`` never raises for a server problem: other groups of the same batch may have succeeded, and a
reason per item is more useful than one exception text.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from processor.engines.base import Engine, ItemResult
from processor.engines.tls import TlsFiles, tls_context, tls_refusal
from processor.wire.records import BatchRecord, TokenItemRecord

#: ``finish_reason`` values that mean the server gave up on the sequence (vLLM: ``abort``).
FAILED_FINISH_REASONS = frozenset({"abort", "error"})
#: Characters of an error body quoted in a reason.
BODY_SNIPPET_CHARS = 200

#: How a batch's prompts go to the server: one request per item, or one per distinct ``max_tokens``.
RequestMode = Literal["item", "budget"]
REQUEST_MODES: tuple[RequestMode, ...] = ("item", "budget")


@dataclass(frozen=True, slots=True)
class OpenAISettings:
    """Parsed options. ``endpoint`` is the full URL of ``/v1/completions``; ``api_key`` is not in repr."""

    endpoint: str
    model: str | None = None
    timeout_s: float = 60.0
    retries: int = 3
    backoff_ms: float = 200.0
    backoff_max_ms: float = 5000.0
    deadline_s: float = 240.0
    max_tokens: int = 256
    temperature: float = 0.0
    api_key: str | None = field(default=None, repr=False)
    requests: RequestMode = "item"
    concurrency: int = 8
    """The most requests of one batch in flight at once (``requests=item``)."""
    tls: TlsFiles = field(default_factory=TlsFiles)
    """``ca_file``, ``cert_file``, ``key_file`` (processor/engines/tls.py): https only."""


class _RequestFailed(Exception):
    """Internal: a group's request failed for good; the text is every item's reason."""


class OpenAICompletionsEngine(Engine):
    """Sends each batch's prompts as token ids to ``/v1/completions``; see the module docstring.

    ``sleep``, ``clock`` and ``rng`` are injected so tests can record backoffs, move a fake clock past
    the deadline and get the same jitter every run. With ``requests=item`` they are called from up to
    ``concurrency`` threads of the engine's own pool (created at the first batch, shut in :meth:`close`).
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
        parts = urllib.parse.urlsplit(settings.endpoint)
        self._https = parts.scheme == "https"
        self._tls = tls_context(settings.tls) if self._https else None
        self._netloc = parts.netloc
        self._target = parts.path + (f"?{parts.query}" if parts.query else "")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"
        self._pool: ThreadPoolExecutor | None = None

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        deadline = self._clock() + self.settings.deadline_s
        results: list[ItemResult | None] = [None] * len(batch.items)
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(batch.items):
            max_tokens = self.settings.max_tokens if item.output_budget is None else item.output_budget
            if max_tokens < 1:
                results[i] = _result(item, "rejected", f"output_budget={max_tokens}: the API needs >= 1")
            else:
                groups.setdefault(max_tokens, []).append(i)
        model = self.settings.model or batch.model
        if self.settings.requests == "item":
            requests = [([i], max_tokens) for max_tokens, positions in groups.items() for i in positions]
        else:
            requests = [(positions, max_tokens) for max_tokens, positions in groups.items()]

        def send(request: tuple[list[int], int]) -> list[ItemResult]:
            positions, max_tokens = request
            return self._run_group(model, [batch.items[i] for i in positions], max_tokens, deadline)

        if len(requests) > 1 and self.settings.requests == "item":
            answers = list(self._threads().map(send, requests))
        else:
            answers = [send(request) for request in requests]
        for (positions, _max_tokens), answer in zip(requests, answers, strict=True):
            for i, result in zip(positions, answer, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="openai-engine")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _run_group(
        self, model: str, items: list[TokenItemRecord], max_tokens: int, deadline: float
    ) -> list[ItemResult]:
        payload = {
            "model": model,
            "prompt": [item.token_ids().tolist() for item in items],
            "max_tokens": max_tokens,
            "temperature": self.settings.temperature,
            "n": 1,
            "stream": False,
        }
        try:
            response = self._post(json.dumps(payload).encode("utf-8"), deadline)
        except _RequestFailed as exc:
            return [_result(item, "failed", str(exc)) for item in items]
        return _map_choices(items, response, max_tokens)

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
                refused = tls_refusal(exc)
                if refused is not None:
                    raise _RequestFailed(f"{self.settings.endpoint}: {refused} (not retried)") from None
                last = f"{type(exc).__name__}: {exc}"
            else:
                if 200 <= status < 300:
                    return _parse_response(data, self.settings.endpoint)
                last = f"HTTP {status}: {_snippet(data)}"
                if not (status == 429 or status >= 500):
                    raise _RequestFailed(f"{self.settings.endpoint}: {last} (not retried)")
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
        return _RequestFailed(
            f"{self.settings.endpoint}: {last} (gave up after {attempts} attempt(s): {why})"
        )


def _parse_response(data: bytes, where: str) -> dict[str, Any]:
    try:
        response = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _RequestFailed(f"{where}: 2xx body is not JSON: {_snippet(data)} (not retried)") from None
    if not isinstance(response, dict) or not isinstance(response.get("choices"), list):
        raise _RequestFailed(f"{where}: 2xx body has no choices list: {_snippet(data)} (not retried)")
    return response


def _map_choices(items: list[TokenItemRecord], response: dict[str, Any], max_tokens: int) -> list[ItemResult]:
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
        results.append(_result(item, "failed", problem) if problem else None)
    counts = _output_token_counts(usable, usage.get("completion_tokens"), max_tokens)
    return [
        r if r is not None else ItemResult(item.item_id, "ok", _text(c), n, None, cache_hit, cached)
        for item, r, c, n in zip(items, results, usable, counts, strict=True)
    ]


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


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header in its delay-seconds form; an HTTP date is ignored."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _snippet(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip().replace("\n", " ")
    return (text[:BODY_SNIPPET_CHARS] + "...") if len(text) > BODY_SNIPPET_CHARS else text or "(empty body)"


def _result(item: TokenItemRecord, status: Literal["failed", "rejected"], reason: str) -> ItemResult:
    return ItemResult(item.item_id, status, b"", 0, reason, False)


# --------------------------------------------------------------------------------------------------
# Options

OPTIONS = (
    "url",
    "model",
    "timeout_s",
    "retries",
    "backoff_ms",
    "backoff_max_ms",
    "deadline_s",
    "max_tokens",
    "temperature",
    "api_key_env",
    "requests",
    "concurrency",
    "ca_file",
    "cert_file",
    "key_file",
)


def from_options(options: dict[str, str]) -> OpenAICompletionsEngine:
    """Build from ``--engine-opt KEY=VALUE`` strings; see :func:`parse_options`."""
    return OpenAICompletionsEngine(parse_options(options))


def parse_options(options: dict[str, str]) -> OpenAISettings:
    """Settings from strings. ``url`` is required; the rest default as in :class:`OpenAISettings`.

    ``url`` is the server's base URL (``http://vllm:8000``), its ``/v1``, or the full
    ``/v1/completions`` URL. ``api_key_env`` names an environment variable holding a bearer token, read
    now, so a missing one fails at start-up. Raises ``ValueError`` with one line naming the bad option.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"openai engine: unknown option(s) {', '.join(unknown)} (known: {', '.join(OPTIONS)})"
        )
    if not options.get("url"):
        raise ValueError("openai engine: url is required, e.g. --engine-opt url=http://vllm:8000")
    d = OpenAISettings(endpoint="")
    backoff_ms = _number(options, "backoff_ms", d.backoff_ms, minimum=0.0)
    backoff_max_ms = _number(options, "backoff_max_ms", max(d.backoff_max_ms, backoff_ms), minimum=0.0)
    if backoff_max_ms < backoff_ms:
        raise ValueError(
            f"openai engine: backoff_max_ms={backoff_max_ms:g} is below backoff_ms={backoff_ms:g}; raise it"
        )
    return OpenAISettings(
        endpoint=_endpoint(options["url"]),
        model=options.get("model") or None,
        timeout_s=_number(options, "timeout_s", d.timeout_s, minimum=0.0, strict=True),
        retries=int(_number(options, "retries", d.retries, minimum=0, integer=True)),
        backoff_ms=backoff_ms,
        backoff_max_ms=backoff_max_ms,
        deadline_s=_number(options, "deadline_s", d.deadline_s, minimum=0.0, strict=True),
        max_tokens=int(_number(options, "max_tokens", d.max_tokens, minimum=1, integer=True)),
        temperature=_number(options, "temperature", d.temperature, minimum=0.0),
        api_key=_api_key(options.get("api_key_env")),
        requests=_request_mode(options.get("requests", d.requests)),
        concurrency=int(_number(options, "concurrency", d.concurrency, minimum=1, integer=True)),
        tls=_tls_files(options),
    )


def _tls_files(options: dict[str, str]) -> TlsFiles:
    """The TLS files, checked now: they need an https url, and must load (one line otherwise)."""
    files = TlsFiles(options.get("ca_file"), options.get("cert_file"), options.get("key_file"))
    if files.given and not options["url"].startswith("https://"):
        raise ValueError("openai engine: ca_file, cert_file and key_file need an https:// url")
    if files.given:
        tls_context(files)
    return files


def _request_mode(value: str) -> RequestMode:
    for mode in REQUEST_MODES:
        if value == mode:
            return mode
    raise ValueError(f"openai engine: requests={value!r} is not one of {', '.join(REQUEST_MODES)}")


def _endpoint(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"openai engine: url={url!r} is not an http(s) URL, e.g. http://vllm:8000")
    if parts.username is not None or parts.password is not None:
        raise ValueError("openai engine: url must not carry credentials; put a token in api_key_env")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1/completions"):
        path += "/completions" if path.endswith("/v1") else "/v1/completions"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _api_key(env_name: str | None) -> str | None:
    if env_name is None:
        return None
    key = os.environ.get(env_name, "")
    if not key:
        raise ValueError(f"openai engine: api_key_env={env_name}: that variable is unset or empty")
    return key


def _number(
    options: dict[str, str],
    key: str,
    default: float,
    *,
    minimum: float,
    strict: bool = False,
    integer: bool = False,
) -> float:
    """``options[key]`` as a number >= ``minimum`` (> with ``strict``), or ``default`` when absent."""
    if key not in options:
        return default
    raw = options[key]
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"openai engine: {key}={raw!r} is not {kind}") from None
    if not math.isfinite(value) or not (value > minimum if strict else value >= minimum):
        raise ValueError(f"openai engine: {key}={raw!r} must be {'>' if strict else '>='} {minimum:g}")
    return value
