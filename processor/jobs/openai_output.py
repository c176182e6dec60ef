"""``collect --format openai``: a job's results as the OpenAI Batch API's output file and error file.

Scripts written for the OpenAI (or vLLM ``run-batch``) batch APIs read two JSON-lines files, one
object per request, matched to the input by ``custom_id`` (not by order)::

    {"id": "batch_req_...", "custom_id": "...", "error": null,
     "response": {"status_code": 200, "request_id": "...", "body": {<a completions response>}}}

The output file holds the rows whose result is ``ok``; the error file every other row, as OpenAI
writes them (its ``error`` is "for requests that failed with a non-HTTP error"): a row that got an
HTTP error has ``response: {"status_code", "request_id", "body": {"error": {"message", "type",
"param", "code"}}}`` and ``error: null`` (``rejected``: the status the server refused the prompt with,
400 when the engine refused it itself; ``invalid``, a line submit refused: 400; ``failed`` with a
status in its reason: that status); a row with no HTTP response has ``response: null`` and ``error:
{"code", "message"}`` (``failed`` without one, a timeout or a dropped connection: ``server_error``;
``cancelled``: ``batch_cancelled``; ``expired``: ``batch_expired``, as OpenAI writes the requests a
cancelled or expired batch did not run).

Every value is derived from the collected result, so writing the files again gives the same bytes:
``id`` is a digest of the job, row and attempt; ``request_id`` the item id that produced the
result (``NAME:<row>``, or ``NAME.r2:<row>`` for a retry attempt); ``created`` the completion time
in seconds. The body is a ``text_completion`` (``choices[0].text``) for ``/v1/completions`` and a
``chat.completion`` (``choices[0].message.content``) for ``/v1/chat/completions``, with
``finish_reason``, ``logprobs`` and ``usage`` (``prompt_tokens``, ``completion_tokens``,
``total_tokens``, ``prompt_tokens_details.cached_tokens``); for ``/v1/embeddings`` a ``list`` of one
``embedding`` (its floats) with ``usage`` ``prompt_tokens`` and ``total_tokens``.

The engine's output is the generated text, or (an OpenAI line's item, whose metadata asks for it, or
a row that asked for logprobs: processor/engines) the JSON object ``{"text", "finish_reason",
"output_tokens", "logprobs"}``: :func:`parse_engine_output` tells them apart by that exact set of
keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from processor.jobs.model import JobRecord, RowResult, RowStatus, item_id

Endpoint = Literal["/v1/completions", "/v1/chat/completions", "/v1/embeddings"]
ENDPOINTS: tuple[Endpoint, ...] = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")
#: A reason that starts with the HTTP status the server answered (processor/engines/openai_http.py).
_HTTP_STATUS = re.compile(r"HTTP (\d{3})\b")
#: The keys of the engine's structured output (processor/engines: an item that asked for logprobs).
ENGINE_OUTPUT_KEYS = frozenset({"text", "finish_reason", "output_tokens", "logprobs"})
#: finish_reason when the engine's output does not say: the model stopped by itself.
DEFAULT_FINISH_REASON = "stop"


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """What the engine generated for one item: the text and, when it said, why it stopped and the
    log-probabilities (in the server's own form, passed through)."""

    text: str
    finish_reason: str | None = None
    logprobs: Any = None


def parse_engine_output(output: bytes) -> EngineOutput:
    """The engine's output of one item: plain text, or its JSON object form (module docstring).

    A JSON object is the structured form only with exactly :data:`ENGINE_OUTPUT_KEYS` and a string
    ``text``, so a model whose answer is some other JSON object keeps it as its text. Bytes that are
    not UTF-8 are decoded with replacement characters (the jsonl output keeps them in base64)."""
    text = output.decode("utf-8", "replace")
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and set(parsed) == ENGINE_OUTPUT_KEYS and isinstance(parsed["text"], str):
            reason = parsed["finish_reason"]
            return EngineOutput(
                parsed["text"], reason if isinstance(reason, str) else None, parsed["logprobs"]
            )
    return EngineOutput(text)


def line_id(job: str, row: int, attempt: int) -> str:
    """The ``id`` of a row's line: ``batch_req_`` and 32 hex digits of a digest of where it came
    from, so a second collect writes the same id."""
    return "batch_req_" + hashlib.sha256(f"{job}\0{row}\0{attempt}".encode()).hexdigest()[:32]


def usage(result: RowResult) -> dict[str, Any]:
    """The OpenAI ``usage`` object of a result."""
    return {
        "prompt_tokens": result.input_tokens,
        "completion_tokens": result.output_tokens,
        "total_tokens": result.input_tokens + result.output_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def embeddings_body(result: RowResult, *, model: str) -> dict[str, Any]:
    """The ``/v1/embeddings`` response of one input: the embed engine's output is the vector's
    float32 components, little-endian (processor/engines/embed.py)."""
    vector = array("f")
    vector.frombytes(result.output[: len(result.output) // 4 * 4])
    if sys.byteorder != "little":
        vector.byteswap()
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": vector.tolist()}],
        "model": model,
        "usage": {"prompt_tokens": result.input_tokens, "total_tokens": result.input_tokens},
    }


def response_body(result: RowResult, *, endpoint: Endpoint, model: str, body_id: str) -> dict[str, Any]:
    """The completions, chat completions or embeddings response the row's result stands for."""
    if endpoint == "/v1/embeddings":
        return embeddings_body(result, model=model)
    out = parse_engine_output(result.output)
    choice: dict[str, Any] = {"index": 0}
    if endpoint == "/v1/chat/completions":
        choice["message"] = {"role": "assistant", "content": out.text}
        prefix, kind = "chatcmpl-", "chat.completion"
    else:
        choice["text"] = out.text
        prefix, kind = "cmpl-", "text_completion"
    choice["logprobs"] = out.logprobs
    choice["finish_reason"] = out.finish_reason or DEFAULT_FINISH_REASON
    return {
        "id": prefix + body_id,
        "object": kind,
        "created": (result.completed_ms or 0) // 1000,
        "model": model,
        "choices": [choice],
        "usage": usage(result),
    }


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """How a row that is not ok appears in the error file."""

    code: str
    status_code: int | None
    """The HTTP status of the response when its reason names none; None: no HTTP response (the
    request never ran, or failed without one: ``response: null`` and ``error`` set)."""
    error_type: str
    default_message: str


ERROR_KINDS: Mapping[RowStatus, ErrorKind] = {
    "failed": ErrorKind("server_error", None, "server_error", "the engine failed this request"),
    "rejected": ErrorKind("invalid_request", 400, "invalid_request_error", "the engine refused this request"),
    "invalid": ErrorKind(
        "invalid_request", 400, "invalid_request_error", "submit could not make a request of this line"
    ),
    "cancelled": ErrorKind(
        "batch_cancelled", None, "batch_cancelled", "This request was not run: the job was cancelled."
    ),
    "expired": ErrorKind(
        "batch_expired",
        None,
        "batch_expired",
        "This request could not be run before the job's completion window expired.",
    ),
}


def batch_line(
    result: RowResult, custom_id: str, *, job: str, model: str, endpoint: Endpoint
) -> tuple[bool, dict[str, Any]]:
    """``(is_error, line)``: the row's line of the output file (ok) or of the error file."""
    digest = line_id(job, result.row, result.attempt)
    request_id = result.item_id or f"{job}:{result.row}"
    line: dict[str, Any] = {"id": digest, "custom_id": custom_id}
    if result.status == "ok":
        body = response_body(result, endpoint=endpoint, model=model, body_id=digest[len("batch_req_") :])
        line["response"] = {"status_code": 200, "request_id": request_id, "body": body}
        line["error"] = None
        return False, line
    kind = ERROR_KINDS[result.status]
    message = result.reason or kind.default_message
    status = http_status(result, kind)
    if status is None:  # OpenAI: ``error`` is for a request that failed without an HTTP response
        line["response"] = None
        line["error"] = {"code": kind.code, "message": message}
        return True, line
    if status >= 500:
        error_type, code = "server_error", "server_error"
    elif result.status == "failed":  # a 4xx the engine did not take as the prompt's (401, 403, 404)
        error_type, code = "invalid_request_error", "invalid_request"
    else:
        error_type, code = kind.error_type, kind.code
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    line["response"] = {"status_code": status, "request_id": request_id, "body": body}
    line["error"] = None
    return True, line


def http_status(result: RowResult, kind: ErrorKind) -> int | None:
    """The HTTP status a row that is not ok got: the one its reason starts with (the server's, for a
    row the engine ran), else its kind's (None: no HTTP response)."""
    found = _HTTP_STATUS.match(result.reason or "") if result.status in ("failed", "rejected") else None
    return int(found.group(1)) if found else kind.status_code


#: Per joined row (its result and its input values): the custom_id, the endpoint and the model.
RequestOf = Callable[[RowResult, dict[str, Any] | None], tuple[str, Endpoint, str]]


def request_of_job(job: JobRecord) -> RequestOf:
    """Where a row's ``custom_id``, endpoint and model come from.

    A job submitted from an OpenAI batch input file (processor/jobs/openai_input.py) keeps them in
    its input line: the line's ``custom_id``, ``url`` and ``body.model``. A line too malformed to
    have a string ``custom_id`` (a bad row) gets its item id. A job from a template has no
    custom ids: a row's is its item id, ``<job>:<row>`` (the same for every attempt), its endpoint
    ``/v1/completions`` (a template renders one prompt text) and its model the job's."""
    from processor.jobs.openai_input import custom_id_of, endpoint_of, is_openai_job

    if not is_openai_job(job):
        return lambda result, values: (item_id(job.name, result.row), "/v1/completions", job.model)

    def from_line(result: RowResult, values: dict[str, Any] | None) -> tuple[str, Endpoint, str]:
        endpoint = endpoint_of(values)
        body = None if values is None else values.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        return (
            custom_id_of(values) or item_id(job.name, result.row),
            next((e for e in ENDPOINTS if e == endpoint), "/v1/completions"),
            model if isinstance(model, str) and model else job.model,
        )

    return from_line


def write_openai(
    out: str | Path,
    errors: str | Path,
    rows: Iterable[tuple[RowResult, dict[str, Any] | None]],
    *,
    job: str,
    request_of: RequestOf,
) -> tuple[int, int]:
    """Write the output file and the error file, each atomically (a temporary file renamed over
    it, the output last); returns the lines written to each.

    One line per row and one per ``custom_id`` over both files: a row whose ``custom_id`` an earlier
    row already has (a duplicate in the input, which submit refuses as a bad row) is written under
    its item id, ``<job>:<row>``, its error message naming the duplicate; so a script that joins the
    files by ``custom_id`` never has a refused duplicate overwrite the result of the line that ran."""
    targets = (Path(out), Path(errors))
    temps = [t.with_name(f".{t.name}.tmp-{os.getpid()}") for t in targets]
    counts = [0, 0]
    taken: set[str] = set()
    try:
        with open(temps[0], "wb") as ok_file, open(temps[1], "wb") as error_file:
            for result, values in rows:
                custom_id, endpoint, model = request_of(result, values)
                if custom_id in taken:
                    custom_id = item_id(job, result.row)
                taken.add(custom_id)
                is_error, line = batch_line(result, custom_id, job=job, model=model, endpoint=endpoint)
                (error_file if is_error else ok_file).write(_json_line(line))
                counts[is_error] += 1
            for f in (ok_file, error_file):
                f.flush()
                os.fsync(f.fileno())
        os.replace(temps[1], targets[1])
        os.replace(temps[0], targets[0])
    finally:
        for t in temps:
            t.unlink(missing_ok=True)
    return counts[0], counts[1]


def errors_path(out: str | Path) -> Path:
    """Where the error file goes by default: ``results.jsonl`` -> ``results.errors.jsonl``."""
    p = Path(out)
    stem = p.name[: -len(".jsonl")] if p.name.endswith(".jsonl") else p.name
    return p.with_name(f"{stem}.errors.jsonl")


def _json_line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")
