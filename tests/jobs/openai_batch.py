"""The OpenAI Batch API's output and error file lines as JSON Schemas, for the tests of
``collect --format openai`` (processor/jobs/openai_output.py) to validate against.

Written from OpenAI's API reference (the ``BatchRequestOutput`` object, "the per-line object of the
batch output and error files", and the completions and chat completions response objects its
``body`` holds), and from vLLM's ``run_batch`` protocol, which writes the same lines:

* a line is ``{"id": str, "custom_id": str, "response": {...} | null, "error": {...} | null}``;
* ``response`` is ``{"status_code": int, "request_id": str, "body": object}``;
* ``error`` is ``{"code": str, "message": str}``;
* an output-file line has ``status_code`` 200, a response body, and ``error`` null;
* an error-file line is either a request that got an HTTP error (``response`` with a status of 400
  or more and a body ``{"error": {"message", "type", "param", "code"}}``, ``error`` null) or one that
  failed without an HTTP response (``response`` null, ``error`` set): OpenAI's ``error`` is "for
  requests that failed with a non-HTTP error".
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema

USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {
            "type": "object",
            "properties": {"cached_tokens": {"type": "integer", "minimum": 0}},
        },
    },
}
FINISH_REASON = {"enum": ["stop", "length", "content_filter", "tool_calls", "function_call"]}


def _response(kind: str, choice: dict[str, Any]) -> dict[str, Any]:
    """A completions response object (``object`` = ``kind``) whose choices have ``choice``'s fields
    besides ``index``, ``logprobs`` and ``finish_reason``."""
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": kind},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["index", *choice, "logprobs", "finish_reason"],
                    "properties": {
                        "index": {"type": "integer"},
                        **choice,
                        "logprobs": {"type": ["object", "null"]},
                        "finish_reason": FINISH_REASON,
                    },
                },
            },
            "usage": USAGE,
        },
    }


COMPLETION = _response("text_completion", {"text": {"type": "string"}})
CHAT_COMPLETION = _response(
    "chat.completion",
    {
        "message": {
            "type": "object",
            "required": ["role", "content"],
            "properties": {"role": {"const": "assistant"}, "content": {"type": ["string", "null"]}},
        }
    },
)
EMBEDDINGS = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {"type": "array", "items": {"type": "number"}},
                },
            },
        },
        "model": {"type": "string"},
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "total_tokens"],
            "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
        },
    },
}
ERROR = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
}
LINE = {
    "type": "object",
    "required": ["id", "custom_id", "response", "error"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "custom_id": {"type": "string", "minLength": 1},
        "response": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["status_code", "request_id", "body"],
                    "properties": {
                        "status_code": {"type": "integer"},
                        "request_id": {"type": "string"},
                        "body": {"type": ["object", "null"]},
                    },
                },
            ]
        },
        "error": {"oneOf": [{"type": "null"}, ERROR]},
    },
}
OUTPUT_LINE = {
    "allOf": [
        LINE,
        {
            "properties": {
                "response": {
                    "type": "object",
                    "properties": {
                        "status_code": {"const": 200},
                        "body": {"oneOf": [COMPLETION, CHAT_COMPLETION, EMBEDDINGS]},
                    },
                },
                "error": {"type": "null"},
            }
        },
    ]
}
HTTP_ERROR_BODY = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"}},
        }
    },
}
ERROR_LINE = {
    "allOf": [
        LINE,
        {
            "oneOf": [
                {
                    "properties": {
                        "response": {
                            "type": "object",
                            "properties": {"status_code": {"minimum": 400}, "body": HTTP_ERROR_BODY},
                        },
                        "error": {"type": "null"},
                    }
                },
                {"properties": {"response": {"type": "null"}, "error": ERROR}},
            ]
        },
    ]
}


def validate_files(out: Path, errors: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Both files' lines, each validated against its schema; AssertionError when a custom_id has
    two lines in one file (OpenAI writes one line per request)."""
    import json

    ok = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    bad = [json.loads(line) for line in errors.read_text(encoding="utf-8").splitlines()]
    for line in ok:
        jsonschema.validate(line, OUTPUT_LINE)
    for line in bad:
        jsonschema.validate(line, ERROR_LINE)
    for lines in (ok, bad):
        twice = [c for c, n in Counter(line["custom_id"] for line in lines).items() if n > 1]
        assert not twice, f"custom_ids with two lines: {twice[:5]}"
    return ok, bad
