"""The random-weight model's shapes against the request's fixed cost, on one local llama-server each.

    .venv/bin/python benchmarks/bench_llm_shape.py [--shape prod --shape small] [--json F]

For each shape (processor/local/llm/model.py, ``MODEL_SHAPES``) a fresh server of the demo's settings
(4 slots of 4,096 positions, one thread) measures, as the server itself reports it (``timings``):

* the prefill cost per token: ``prompt_ms / prompt_n`` of a prompt of the generative backlog's median
  length (861 tokens, no cache), the median of 3, and the median prompt's prefill in ms;
* the server's fixed cost per request: the wall time of ``POST /v1/completions`` with a 4-token
  prompt and 1 output token, the median of 20 (HTTP, the server's scheduling, one forward pass);
* the decode cost per step, alone and with 4 sequences in flight (``predicted_ms / predicted_n``).

The Kafka path's fixed cost per item is the other half of the overhead: ``tokenfabric demo --engine
sim --time-scale 0`` drains the backlog with engines that take no time (docs/demo.md has both). Like
every benchmark here it asserts nothing; figures move with the machine's load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from processor.local.llm.build import build_server
from processor.local.llm.model import MODEL_SHAPES, ensure_model
from processor.local.llm.server import ServerSettings, start_server, stop_server

MEDIAN_PROMPT = 861
"""The generative backlog's median prompt over its first 300 rows (tokens)."""


def _post(port: int, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    answer: dict[str, Any] = json.loads(conn.getresponse().read())
    conn.close()
    return time.perf_counter() - started, answer


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [101] + [rng.randrange(1996, 30522) for _ in range(n - 1)]


def measure(shape: str) -> dict[str, float | str]:
    """One shape's figures on a fresh server (see the module docstring)."""
    name = f"bench-shape-{shape}"
    info = start_server(build_server().binary, ensure_model(MODEL_SHAPES[shape]), name=name,
                        settings=ServerSettings(slots=4, ctx_tokens=16384, threads=1))  # fmt: skip
    try:
        _post(info.port, {"prompt": [_ids(8, 0)], "max_tokens": 1})  # warm
        fixed = [_post(info.port, {"prompt": [_ids(4, i)], "max_tokens": 1})[0] for i in range(1, 21)]
        per_token = []
        for i in range(3):
            timings = _post(info.port, {"prompt": [_ids(MEDIAN_PROMPT, 100 + i)], "max_tokens": 1})[1][
                "timings"
            ]
            per_token.append(timings["prompt_ms"] / timings["prompt_n"])
        body = {"max_tokens": 64, "ignore_eos": True}
        alone = _post(info.port, {**body, "prompt": [_ids(100, 7)]})[1]["timings"]
        with ThreadPoolExecutor(4) as pool:
            four = list(
                pool.map(lambda i: _post(info.port, {**body, "prompt": [_ids(100, 50 + i)]})[1], range(4))
            )
        prefill_ms = statistics.median(per_token)
        fixed_ms = 1000 * statistics.median(fixed)
        return {
            "shape": shape,
            "prefill_ms_per_token": round(prefill_ms, 4),
            "median_prompt_prefill_ms": round(prefill_ms * MEDIAN_PROMPT, 1),
            "server_fixed_ms_per_request": round(fixed_ms, 2),
            "decode_ms_per_step_alone": round(alone["predicted_ms"] / alone["predicted_n"], 2),
            "decode_ms_per_step_4_in_flight": round(
                statistics.mean(a["timings"]["predicted_ms"] / a["timings"]["predicted_n"] for a in four), 2
            ),
        }
    finally:
        stop_server(name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", choices=sorted(MODEL_SHAPES), help="default: every shape")
    p.add_argument("--json", default=None, help="write the figures here too")
    args = p.parse_args()
    rows = [measure(shape) for shape in args.shape or sorted(MODEL_SHAPES)]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
