"""``tokenfabric submit`` of a large OpenAI batch input file: peak resident memory and time.

    python benchmarks/bench_openai_file.py                  # 50,000 lines, about 200 MB (OpenAI's limits)
    python benchmarks/bench_openai_file.py --smoke          # 2,000 lines, about 8 MB
    python benchmarks/bench_openai_file.py --lines N --line-bytes B --json out.json

OpenAI's batch API takes up to 50,000 lines or 200 MB a file. Submit reads the file as a stream (a
first pass for the job's model and chat prefix, then chunks of 512 lines tokenised and produced), so
its memory should not grow with the file: what grows is one entry per ``custom_id`` (duplicates are
refused across the whole file) and whatever the producer's queue holds while the broker catches up.

Two files are submitted side by side in fresh processes, the full one and one a tenth of its size,
each to fresh topics on the broker at ``$KAFKA_BOOTSTRAP``: half the lines are completions prompts
of text (tokenised by submit), half prompts of token ids, each about ``--line-bytes`` long. Peak RSS
is the child's ``ru_maxrss`` (``os.wait4``), so it counts the interpreter, the tokenizer and the
producer's queue. The claim is the ratio: peak RSS of the full file over the tenth's, beside the ratio
of their sizes (10x).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FULL_LINES = 50_000
SMOKE_LINES = 2_000
LINE_BYTES = 4_000
#: Common English words, each one WordPiece token: text prompts that tokenise to real ids.
_TEXT = "the parcel came late but the soup was warm and the river ran past the old mill where a lamp"
WORDS = tuple(_TEXT.split(" "))


def write_file(path: Path, lines: int, line_bytes: int, seed: int = 7) -> int:
    """An OpenAI batch input of ``lines`` completions lines of about ``line_bytes`` each; its size."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for n in range(lines):
            body: dict[str, Any] = {"model": "bench-model", "max_tokens": 16}
            if n % 2:
                count = line_bytes // 6  # "12345," and a space
                body["prompt"] = [rng.randrange(1000, 30_000) for _ in range(count)]
            else:
                text: list[str] = []
                size = 0
                while size < line_bytes - 120:
                    word = rng.choice(WORDS)
                    text.append(word)
                    size += len(word) + 1
                body["prompt"] = " ".join(text)
            line = {"custom_id": f"req-{n}", "method": "POST", "url": "/v1/completions", "body": body}
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    return path.stat().st_size


def submit_measured(path: Path, bootstrap: str, job: str) -> dict[str, Any]:
    """Create fresh topics, run ``tokenfabric submit`` on ``path`` in a child; its peak RSS and time."""
    from processor.kafka.topics import TopicNames, create_topics, topic_specs

    prefix = f"bof{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": bootstrap}
    create_topics(conf, topic_specs(TopicNames(prefix), ingest_partitions=3))
    argv = [sys.executable, "-m", "processor", "submit", str(path), "--job", job, "--no-progress"]
    argv += ["--bootstrap", bootstrap, "--topic-prefix", prefix]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    out, err = proc.stdout.read() if proc.stdout else "", proc.stderr.read() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"submit exited {proc.returncode}: {err.strip()[-500:]}")
    _delete_prefix(conf, prefix)
    return {
        "file_bytes": path.stat().st_size,
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "seconds": round(seconds, 1),
        "said": out.strip(),
    }


def _delete_prefix(conf: dict[str, str], prefix: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(conf)
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + ".")]
    for future in admin.delete_topics(names, operation_timeout=30).values():
        future.result()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--lines", type=int, default=None, help=f"default {FULL_LINES:,} ({SMOKE_LINES:,} with --smoke)"
    )
    p.add_argument("--line-bytes", type=int, default=LINE_BYTES)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--json", default=None, help="write the figures here too")
    args = p.parse_args(argv)
    lines = args.lines or (SMOKE_LINES if args.smoke else FULL_LINES)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-openai-file-") as tmp:
        for label, count in (("tenth", max(1, lines // 10)), ("full", lines)):
            path = Path(tmp) / f"{label}.jsonl"
            write_file(path, count, args.line_bytes)
            rows[label] = {"lines": count, **submit_measured(path, args.bootstrap, f"bof-{label}")}
            path.unlink()
    ratio_rss = rows["full"]["peak_rss_mib"] / rows["tenth"]["peak_rss_mib"]
    ratio_file = rows["full"]["file_bytes"] / rows["tenth"]["file_bytes"]
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"{'file':<6} {'lines':>8} {'MB':>8} {'peak RSS MiB':>13} {'seconds':>8} {'lines/s':>8}")
    for label, r in rows.items():
        rate = r["lines"] / r["seconds"] if r["seconds"] else 0.0
        print(
            f"{label:<6} {r['lines']:>8,} {r['file_bytes'] / 1e6:>8.1f} {r['peak_rss_mib']:>13.1f} "
            f"{r['seconds']:>8.1f} {rate:>8,.0f}"
        )
    print(f"full/tenth: file {ratio_file:.1f}x, peak RSS {ratio_rss:.2f}x (load average {' '.join(load)})")
    if args.json:
        payload = {"runs": rows, "rss_ratio": ratio_rss, "file_ratio": ratio_file, "load": load}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
