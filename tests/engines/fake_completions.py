"""A stand-in ``/v1/completions`` server for the ``openai`` engine's tests: a real HTTP server on loopback
with a script of replies, for the failure paths a real generation server cannot be made to produce.

It answers each prompt with ``sum=<sum of its ids> n=<len> max=<max_tokens>``, so a test can tell which
prompt a choice belongs to and catch a choice mapped to the wrong item. Each test scripts the server's
next replies (status, delay, shuffled or dropped choices) and reads back the requests it received.
``refuse`` refuses, like llama.cpp, every unscripted request that holds a prompt it names.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Reply:
    """What the server does with one request; unscripted requests get ``Reply()`` (a good answer)."""

    status: int = 200
    delay_s: float = 0.0
    order: str = "in-order"  # or "reversed"
    drop: tuple[int, ...] = ()
    duplicate: tuple[int, ...] = ()
    finish: dict[int, str] = field(default_factory=dict)
    token_ids: bool = True
    cached_tokens: int | None = None
    cache_n: int | None = None
    """llama.cpp's ``timings.cache_n`` (sent only when set)."""
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]


class FakeCompletions:
    """A ``ThreadingHTTPServer`` on 127.0.0.1, port 0, with a script of replies."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.received: list[Received] = []
        self.stopping = threading.Event()
        self.cache: Callable[[list[int]], int] | None = None
        """Unscripted requests of one prompt report ``cache(prompt)`` cached tokens, when set."""
        self.cache_field = "usage"  # or "timings": where the cached count goes (llama.cpp has both)
        self.hold_s = 0.0  # every request waits this long: lets requests overlap
        self.refuse: dict[int, int] = {}
        """Token id -> status: an unscripted request with a prompt holding that id is refused with that
        status and llama.cpp's error shape, ``{"error": {"code", "message", "type"}}``."""
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake._lock:
                    fake.received.append(Received(body, dict(self.headers)))
                    reply = fake.script.pop(0) if fake.script else fake.unscripted(body)
                    fake.in_flight += 1
                    fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
                self.answered = False
                try:
                    self.answer(body, reply)
                finally:
                    self.leave_flight()

            def leave_flight(self) -> None:
                """Counts this request out of flight once, before its reply is written: a client that
                reads the reply and sends its next request at once must not be counted as overlapping
                this handler's last few instructions (that raced, and a test read 2 for 1)."""
                if not self.answered:
                    self.answered = True
                    with fake._lock:
                        fake.in_flight -= 1

            def answer(self, body: dict[str, Any], reply: Reply) -> None:
                if fake.hold_s and fake.stopping.wait(fake.hold_s):
                    return
                if reply.delay_s and fake.stopping.wait(reply.delay_s):
                    return
                self.leave_flight()
                if reply.raw is not None:
                    payload = reply.raw
                elif reply.status != 200:
                    payload = json.dumps({"object": "error", "message": f"scripted {reply.status}"}).encode()
                else:
                    payload = json.dumps(_completion(body, reply)).encode()
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client timed out and hung up

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll interval: shutdown() waits up to one interval, and every test stops a server.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)

    def prompts(self, request: int) -> list[list[int]]:
        return [list(p) for p in self.received[request].body["prompt"]]

    def unscripted(self, body: dict[str, Any]) -> Reply:
        for prompt in body["prompt"]:
            for token_id, status in self.refuse.items():
                if token_id in prompt:
                    error = {
                        "code": status,
                        "message": f"token {token_id} refused",
                        "type": "invalid_request",
                    }
                    return Reply(status=status, raw=json.dumps({"error": error}).encode())
        if self.cache is None or len(body["prompt"]) != 1:
            return Reply()
        cached = self.cache(body["prompt"][0])
        return Reply(cached_tokens=cached) if self.cache_field == "usage" else Reply(cache_n=cached)


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """A ``text_completion`` in the API's shape; ``min(max_tokens, len(prompt))`` tokens per choice."""
    max_tokens = body["max_tokens"]
    choices = []
    generated = 0
    for index, ids in enumerate(body["prompt"]):
        count = min(max_tokens, len(ids))
        generated += count
        choice: dict[str, Any] = {
            "index": index,
            "text": f"sum={sum(ids)} n={len(ids)} max={max_tokens}",
            "logprobs": None,
            "finish_reason": reply.finish.get(index, "length" if count == max_tokens else "stop"),
        }
        if reply.token_ids:
            choice["token_ids"] = list(range(count))
        if index not in reply.drop:
            choices.append(choice)
        if index in reply.duplicate:
            choices.append(dict(choice, text="again"))
    if reply.order == "reversed":
        choices.reverse()
    usage: dict[str, Any] = {
        "prompt_tokens": sum(len(p) for p in body["prompt"]),
        "completion_tokens": generated,
        "total_tokens": sum(len(p) for p in body["prompt"]) + generated,
    }
    if reply.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
    response = {
        "id": "cmpl-test",
        "object": "text_completion",
        "model": body["model"],
        "choices": choices,
        "usage": usage,
    }
    if reply.cache_n is not None:
        response["timings"] = {"cache_n": reply.cache_n, "prompt_n": usage["prompt_tokens"] - reply.cache_n}
    return response


@pytest.fixture
def server() -> Iterator[FakeCompletions]:
    fake = FakeCompletions()
    fake.thread.start()
    yield fake
    fake.stopping.set()
    fake.server.shutdown()
    fake.server.server_close()
