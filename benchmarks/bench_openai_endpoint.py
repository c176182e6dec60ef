"""The generative side-by-side against servers you run: tokenfabric and the plain queue, one command.

    .venv/bin/python benchmarks/bench_openai_endpoint.py \\
        --endpoint http://gpu-a:8000 --endpoint http://gpu-b:8000 --model meta-llama/Llama-3.1-8B-Instruct \\
        --bootstrap kafka:9092 --items 2000

Runs ``tokenfabric demo --engine llm --endpoint ...``: the generative backlog (processor/sim/generative.py)
drained once through tokenfabric and once through the plain Kafka queue, against the same two
OpenAI-compatible servers (one per card, in card order), each run's token ids salted apart so that
the second run finds nothing of the first in the servers' prefix caches. The servers must report
``usage.prompt_tokens_details.cached_tokens`` (vLLM: ``--enable-prompt-tokens-details``; SGLang:
``--enable-cache-report``; docs/engine-openai.md has the full flags), else every cached count reads 0.
Token ids are MiniLM word-piece ids (below 30,522), valid in any vocabulary at least that large.

Prints the figures that matter for a prefix cache as a Markdown table (cached share of the cacheable
prefix tokens, prefill computed, prompt tokens/s and their ratio, latency), and writes the demo's
JSON report next to it (``--json``). Like every benchmark here it asserts nothing; the demo's exit
status (0: both runs completed every item once with a clean audit) is passed on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROWS = (
    ("items completed once", "items_completed_once", "{:,}"),
    ("cacheable prompt tokens (shared prefixes)", "prefix_tokens", "{:,}"),
    ("cached prompt tokens (servers' own count)", "cached_prompt_tokens", "{:,}"),
    ("cached / cacheable", "cached_share_of_prefix", "{:.1%}"),
    ("prefill tokens computed", "prefill_tokens", "{:,}"),
    ("makespan (s)", "makespan_s", "{:,.1f}"),
    ("prompt tokens/s", "real_tokens_per_s", "{:,.0f}"),
    ("dispatch to completion p50 (ms)", "dispatch_to_completion_p50_ms", "{:,.0f}"),
    ("dispatch to completion p99 (ms)", "dispatch_to_completion_p99_ms", "{:,.0f}"),
)
RATIOS = {"prefill_tokens", "makespan_s", "real_tokens_per_s"}


def table(report: dict[str, Any]) -> str:
    """The report's runs side by side, ratios where dividing means something."""
    runs = report["runs"]
    tf, pq = runs["tokenfabric"], runs["plain-queue"]
    others = [n for n in runs if n != "tokenfabric"]  # plain-queue, and share-queue where it ran
    lines = [f"| | tokenfabric | {' | '.join(n.replace('-', ' ') for n in others)} | tokenfabric / plain |"]
    lines.append("|---|" + "---:|" * (len(others) + 2))
    for label, key, fmt in ROWS:
        a, b = tf.get(key), pq.get(key)
        ratio = f"{a / b:.2f}x" if key in RATIOS and a is not None and b else ""
        show = [("-" if v is None else fmt.format(v)) for v in (a, *(runs[n].get(key) for n in others))]
        lines.append(f"| {label} | {' | '.join(show)} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", action="append", required=True, help="a server's base URL, one per card (2)")
    p.add_argument("--model", default=None, help="the model name the servers serve")
    p.add_argument("--bootstrap", required=True, help="the Kafka cluster to run the pipelines on")
    p.add_argument("--items", type=int, default=500, help="items of the generative backlog (default: 500)")
    p.add_argument("--json", default="bench-openai-endpoint.json", help="where the demo's report goes")
    args = p.parse_args()
    demo = [sys.executable, "-m", "processor", "demo", "--engine", "llm", "--plot", ""]
    demo += [f"--endpoint={url}" for url in args.endpoint]
    demo += [] if args.model is None else ["--endpoint-model", args.model]
    demo += ["--limit", str(args.items), "--bootstrap", args.bootstrap, "--json", args.json]
    code = subprocess.run(demo, check=False).returncode
    if Path(args.json).is_file():
        print(table(json.loads(Path(args.json).read_text(encoding="utf-8"))))
    return code


if __name__ == "__main__":
    sys.exit(main())
