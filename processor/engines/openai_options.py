"""The ``openai`` engine's options: ``--engine-opt KEY=VALUE`` strings parsed into :class:`OpenAISettings`.

Every option is checked when the consumer starts (it exits 2 with one line naming the bad option), so a
wrong URL, a missing key variable or an unreadable certificate never waits for the first batch. The
table of options is in docs/engine-openai.md.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from processor.engines.generation import DEFAULT_SERVER, SERVERS, ServerName
from processor.engines.tls import TlsFiles, tls_context

RequestMode = Literal["item", "settings", "budget"]
"""How a batch's prompts go to the server: ``item`` one request per item; ``settings`` one request per
group of items with equal settings and budget, groups concurrently; ``budget`` the same groups one
after the other (what ``budget`` always did: with no item carrying a request, a group is a budget)."""
REQUEST_MODES: tuple[RequestMode, ...] = ("item", "settings", "budget")

OutputMode = Literal["text", "json"]
"""``text``: a completion's output is the choice's text; ``json``: a JSON object with the text, finish
reason, output tokens and logprobs (also what an item whose request asks for logprobs gets)."""
OUTPUT_MODES: tuple[OutputMode, ...] = ("text", "json")

_Word = TypeVar("_Word", bound=str)


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
    """The most requests of one batch in flight at once (``requests=item`` and ``settings``)."""
    tls: TlsFiles = field(default_factory=TlsFiles)
    """``ca_file``, ``cert_file``, ``key_file`` (processor/engines/tls.py): https only."""
    server: ServerName = DEFAULT_SERVER
    """Whose spelling the item's generation request goes in (processor/engines/generation.py)."""
    lora_ids: dict[str, int] = field(default_factory=dict)
    """llama.cpp only: adapter name -> the id of the adapter the server loaded (``--lora``, from 0)."""
    output: OutputMode = "text"
    ignore_eos: bool = False
    """Send ``ignore_eos: true`` (llama.cpp, vLLM, SGLang): each item generates exactly its
    ``max_tokens`` (its ``output_budget``), as a benchmark of real output lengths needs."""
    slot_affinity: int = 0
    """llama.cpp only: the server's slot count; each item's ``id_slot`` is its shape's slot
    (processor/engines/slot_affinity.py). 0: the server picks slots."""


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
    "server",
    "lora_ids",
    "output",
    "ignore_eos",
    "slot_affinity",
)


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
    server = _choice(options, "server", SERVERS, d.server)
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
        requests=_choice(options, "requests", REQUEST_MODES, d.requests),
        concurrency=int(_number(options, "concurrency", d.concurrency, minimum=1, integer=True)),
        tls=_tls_files(options),
        server=server,
        lora_ids=_lora_ids(options.get("lora_ids"), server),
        output=_choice(options, "output", OUTPUT_MODES, d.output),
        ignore_eos=_choice(options, "ignore_eos", ("false", "true"), "false") == "true",
        slot_affinity=_slot_affinity(options, server),
    )


def _slot_affinity(options: dict[str, str], server: ServerName) -> int:
    """``slot_affinity=N``: llama.cpp's ``id_slot`` by shape over N slots (0: off)."""
    slots = int(_number(options, "slot_affinity", 0, minimum=0, integer=True))
    if slots and server != "llamacpp":
        raise ValueError(f"openai engine: slot_affinity is for server=llamacpp, not server={server}")
    return slots


def _tls_files(options: dict[str, str]) -> TlsFiles:
    """The TLS files, checked now: they need an https url, and must load (one line otherwise)."""
    files = TlsFiles(options.get("ca_file"), options.get("cert_file"), options.get("key_file"))
    if files.given and not options["url"].startswith("https://"):
        raise ValueError("openai engine: ca_file, cert_file and key_file need an https:// url")
    if files.given:
        tls_context(files)
    return files


def _choice(options: dict[str, str], key: str, allowed: tuple[_Word, ...], default: _Word) -> _Word:
    """``options[key]`` when it is one of ``allowed``, ``default`` when absent."""
    value = options.get(key, default)
    for word in allowed:
        if value == word:
            return word
    raise ValueError(f"openai engine: {key}={value!r} is not one of {', '.join(allowed)}")


def _lora_ids(value: str | None, server: ServerName) -> dict[str, int]:
    """``name:id,name:id`` -> ``{name: id}``; llama.cpp only (other servers name adapters as models)."""
    if value is None:
        return {}
    if server != "llamacpp":
        raise ValueError(f"openai engine: lora_ids is for server=llamacpp, not server={server}")
    ids: dict[str, int] = {}
    for pair in value.split(","):
        name, _, raw_id = pair.partition(":")
        name = name.strip()
        if not name or not raw_id.strip().isdigit() or name in ids:
            raise ValueError(
                f"openai engine: lora_ids={value!r} is not name:id[,name:id...] (distinct names, ids >= 0)"
            )
        ids[name] = int(raw_id)
    return ids


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
