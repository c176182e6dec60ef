"""Run every benchmark and write docs/benchmarks.md.

    python benchmarks/run_all.py                        # full run, on $KAFKA_BOOTSTRAP or the local broker
    python benchmarks/run_all.py --own-broker           # full run on a fresh broker in /tmp/bench-kafka
    python benchmarks/run_all.py --smoke --out /tmp/benchmarks.md    # tiny sizes, well under 2 minutes

Runs, each as its own script in a child process: ``bench_core.py`` (the scheduling core, no Kafka),
``bench_pipeline.py`` (processor vs a plain passthrough), ``bench_restore.py`` and ``bench_memory.py``;
then writes the machine, the versions, the exact commands, the tables and each target, met or not,
with the number it was judged on. Two sections are written by people and carried over from the
existing file unchanged: "Where the time goes" (the profile and what to do about it) and "Real
compute: embed engine, lanes vs fifo" (merged from docs/benchmarks-embed.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OWN_BROKER_DIR, ROOT, Spread, load_average, machine, versions

HERE = Path(__file__).resolve().parent
BENCHES = ("core", "pipeline", "restore", "memory")
PROFILE_SECTION = "## Where the time goes"
EMBED_SECTION = "## Real compute: embed engine, lanes vs fifo"
PLACEHOLDERS = {
    PROFILE_SECTION: "(not written yet: profile with `python benchmarks/bench_pipeline.py --sizes 1000 "
    "--modes eos --reps 1 --profile /tmp/processor.prof` and summarise here)",
    EMBED_SECTION: "(merged from docs/benchmarks-embed.md)",
}


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    measured: str
    met: bool | None  # None: not measured in this run

    @property
    def status(self) -> str:
        return "not measured" if self.met is None else ("**met**" if self.met else "**not met**")


# -- running ----------------------------------------------------------------------------------------


def run_bench(name: str, args: list[str], commands: list[str], log: Callable[[str], None]) -> str:
    """Run ``benchmarks/bench_<name>.py`` with ``args``; echo and return its stdout."""
    script = HERE / f"bench_{name}.py"
    cmd = [sys.executable, str(script), *args]
    commands.append(" ".join(["python", f"benchmarks/{script.name}", *_printable(args)]))
    log(f"== {name}: {commands[-1]}")
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    log(proc.stdout.rstrip())
    log(f"== {name}: {time.monotonic() - started:.0f} s")
    return proc.stdout


def _printable(args: list[str]) -> list[str]:
    """The command as a reader would type it: the broker and temporary JSON paths as placeholders."""
    out = []
    for previous, a in zip(["", *args], args, strict=False):
        if previous == "--bootstrap":
            a = "$BOOTSTRAP"
        elif a.endswith(".json") and a.startswith(tempfile.gettempdir()):
            a = "OUT.json"
        out.append(a)
    return out


def run_all(args: argparse.Namespace, bootstrap: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    selected = [b for b in BENCHES if b not in set(args.skip.split(",") if args.skip else [])]
    smoke = ["--smoke"] if args.smoke else []
    kafka = ["--bootstrap", bootstrap] if bootstrap else []
    commands: list[str] = []
    results: dict[str, Any] = {"load_start": load_average(), "selected": selected}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for name in selected:
            out = Path(tmp) / f"{name}.json"
            if name == "core":
                results["core"] = run_bench("core", smoke, commands, log)
                continue
            extra = list(args.pipeline_args.split()) if name == "pipeline" and args.pipeline_args else []
            run_bench(
                name,
                [*smoke, *(kafka if name != "memory" else []), *extra, "--json", str(out)],
                commands,
                log,
            )
            results[name] = json.loads(out.read_text())
    results["commands"] = commands
    results["load_end"] = load_average()
    results["seconds"] = time.monotonic() - started
    return results


# -- judging ----------------------------------------------------------------------------------------


def core_rates(text: str) -> dict[str, float]:
    """``phase -> items/s`` from bench_core.py's table."""
    rows = re.findall(r"^\| ([^|]+?) \| [\d,]+ \| [\d.]+ \| ([\d,]+) \|$", text, re.MULTILINE)
    return {phase: float(rate.replace(",", "")) for phase, rate in rows}


def _pipeline_summary(results: dict[str, Any], tokens: int, mode: str) -> dict[str, Spread] | None:
    for entry in results.get("pipeline", {}).get("sizes", []):
        if entry["tokens"] == tokens and mode in entry["modes"]:
            summary = entry["modes"][mode]["summary"]
            return {k: Spread(**v) for k, v in summary.items() if isinstance(v, dict)}
    return None


def targets(results: dict[str, Any]) -> list[Target]:
    out = []
    eos = _pipeline_summary(results, 1000, "eos")
    if eos is None:
        out.append(Target("processor / ceiling >= 0.6 at 1,000 tokens, exactly-once", "-", None))
        out.append(
            Target("processor >= 50k items/s and >= 25M tokens/s (1,000 tokens, exactly-once)", "-", None)
        )
    else:
        ratio, items, toks = eos["ratio"], eos["processor_items_per_s"], eos["processor_tokens_per_s"]
        out.append(
            Target(
                "processor / ceiling >= 0.6 at 1,000 tokens, exactly-once",
                ratio.fmt(".2f"),
                ratio.median >= 0.6,
            )
        )
        out.append(
            Target(
                "processor >= 50k items/s and >= 25M tokens/s (1,000 tokens, exactly-once)",
                f"{items.fmt()} items/s, {toks.fmt('.1f', 1e6)} M tokens/s",
                items.median >= 50_000 and toks.median >= 25e6,
            )
        )
    if "core" in results:
        for phase, rate in core_rates(results["core"]).items():
            if phase.endswith("combined"):
                name = (
                    f"core >= 200k items/s, {phase.replace(': combined', '')} (submit + dispatch + complete)"
                )
                out.append(Target(name, f"{rate:,.0f} items/s (CPU time)", rate >= 200_000))
    else:
        out.append(Target("core >= 200k items/s", "-", None))
    if "memory" in results:
        sizes = results["memory"]["sizes"]
        shown = "; ".join(
            f"{r['tokens_per_item']:,} tokens: {r['bytes_per_item']:,.0f} B/item of "
            f"{r['allowed_per_item']:,.0f} allowed ({r['bytes_per_item'] / r['allowed_per_item']:.2f}x)"
            for r in sizes
        )
        met = all(r["bytes_per_item"] <= r["allowed_per_item"] for r in sizes)
        out.append(Target("memory <= 1.3 x raw token bytes + 300 B per waiting item", shown, met))
    else:
        out.append(Target("memory <= 1.3 x raw token bytes + 300 B per waiting item", "-", None))
    if "restore" in results:
        r = results["restore"]
        start = Spread(**r["start_items_per_s"])
        out.append(
            Target(
                "restore >= 100k items/s",
                f"{start.fmt()} items/s ({r['items']:,} items, `start()` until all waiting)",
                start.median >= 100_000,
            )
        )
    else:
        out.append(Target("restore >= 100k items/s", "-", None))
    return out


# -- the document -----------------------------------------------------------------------------------


def preserved_sections(path: Path) -> dict[str, str]:
    """The hand-written sections of an existing document (heading -> body), else placeholders."""
    found = dict(PLACEHOLDERS)
    if path.exists():
        text = path.read_text()
        for heading in PLACEHOLDERS:
            start = text.find(heading + "\n")
            if start >= 0:
                body_start = start + len(heading) + 1
                end = text.find("\n## ", body_start)
                found[heading] = text[body_start : end if end >= 0 else len(text)].strip()
    return found


def render(results: dict[str, Any], meta: dict[str, Any], preserved: dict[str, str]) -> str:
    import bench_memory
    import bench_pipeline
    import bench_restore

    kind = "smoke sizes" if meta["smoke"] else "full run"
    parts = [
        "# Benchmarks",
        f"Generated by `benchmarks/run_all.py` on {meta['date']} "
        f"({kind}, {results['seconds'] / 60:.1f} min). Every section but the last two is rewritten by "
        "each run; "
        f'"{PROFILE_SECTION[3:]}" and "{EMBED_SECTION[3:]}" are written by hand and carried over. '
        "Scripts print ratios against baselines measured in the same run; nothing here is asserted by "
        "the test suite (`tests/broker/test_benchmarks.py` checks only that the harness works).",
        "## Machine and versions",
        _machine_table(results, meta),
        "## Targets",
        "Each figure is the median over the repetitions, with the range (min-max) in brackets.\n\n"
        "| target | measured | |\n| --- | --- | --- |\n"
        + "\n".join(f"| {t.name} | {t.measured} | {t.status} |" for t in targets(results)),
        "## Commands",
        "```bash\nsource .venv/bin/activate\n" + "\n".join(results["commands"]) + "\n```\n"
        f"`$BOOTSTRAP` is the broker above. All in one: `{meta['invocation']}`.",
    ]
    if "pipeline" in results:
        p = results["pipeline"]
        parts += ["## Pipeline: processor vs a plain Kafka passthrough", _pipeline_text(p, bench_pipeline)]
    if "restore" in results:
        parts += ["## Restore", _restore_text(results["restore"], bench_restore)]
    if "memory" in results:
        parts += ["## Memory per waiting item", _memory_text(results["memory"], bench_memory)]
    if "core" in results:
        core = results["core"].replace("## Scheduling core benchmark\n", "").strip()
        parts += ["## Scheduling core (no Kafka)", "`benchmarks/bench_core.py`, verbatim:\n\n" + core]
    parts += [
        "## Noise",
        NOISE,
        PROFILE_SECTION,
        preserved[PROFILE_SECTION],
        EMBED_SECTION,
        preserved[EMBED_SECTION],
    ]
    return "\n\n".join(parts) + "\n"


def _machine_table(results: dict[str, Any], meta: dict[str, Any]) -> str:
    m, v = meta["machine"], meta["versions"]
    rows = [
        ("CPUs (nproc)", m["nproc"]),
        ("memory", m["memory"]),
        ("CPU", m["cpu"]),
        ("OS", m["os"]),
        ("Python", v["python"]),
        ("confluent-kafka / librdkafka", f"{v['confluent-kafka']} / {v['librdkafka']}"),
        ("broker", f"{v['broker']}, {meta['broker_note']}"),
        ("code measured", meta["source_note"]),
        ("load average (1/5/15 min)", f"start {results['load_start']}, end {results['load_end']}"),
    ]
    return "| | |\n| --- | --- |\n" + "\n".join(f"| {k} | {val} |" for k, val in rows)


def _pipeline_text(p: dict[str, Any], mod: Any) -> str:
    c = p["contract"]
    intro = (mod.__doc__ or "").split("\n\n", 2)[2].strip()
    return (
        f"{intro}\n\nSettings of this run: {p['reps']} repetitions; input of one model, "
        f"{p['shapes']} shapes; "
        f"the drainer's contract: budget {c['budget_tokens']:,} tokens, at most {c['max_items']} items, "
        f"pad multiple {c['pad_multiple']}, {c['max_inflight']} batches in flight. Items/s and tokens/s "
        "are items (and their real, unpadded tokens) divided by the interval above; CPU us/item is CPU "
        "seconds of that side's process (all threads) over the same interval, per item, and the CPU "
        "ratio is ceiling CPU per item / processor CPU per item, the steadier comparison under load. "
        "The loop thread column is the processor's own thread alone (`time.thread_time()`: decoding, "
        "lanes, encoding, commits), the drainer column the simulated consumer's whole process. "
        "Ratios are taken per repetition, each processor run right after its ceiling run. Items/batch "
        'is what the lanes gave the drainer (one lane per batch); "completed within the span" was '
        f"{min(_completed(p)):.0%} or more in every run: most of the work of applying completions falls "
        "inside the measured interval, as it would in steady operation.\n\n"
        f"{mod.table(p['sizes'])}\n\n"
        f"{_cpu_text(mod.cpu_table(p['sizes']))}"
        "The processor's at-least-once runs start with the control group's results offsets committed at "
        "0: a fresh at-least-once processor otherwise reads results from `latest`, resolved only after it "
        'has started, and misses the first completions (see "Where the time goes").'
    )


def _cpu_text(table: str | None) -> str:
    if table is None:
        return ""
    return (
        "Where the CPU went, in us per item, over each side's measured interval: the side's own "
        "processes (the ceiling; the processor and its drainer) and the broker's JVM, read from /proc "
        "(the broker runs on this machine). All of them share the two cores, so once a side keeps both "
        "busy its items/s is two cores' worth of CPU divided by its machine CPU per item, and processor "
        "/ ceiling tends to the machine CPU ratio. The processor's side asks more of the broker than "
        "the ceiling's: the drainer reads every batch back, and there are completions, changelog records "
        "and their reads besides.\n\n"
        f"{table}\n\n"
    )


def _completed(p: dict[str, Any]) -> list[float]:
    return [m["summary"]["completions_in_span"] for e in p["sizes"] for m in e["modes"].values()]


def _restore_text(r: dict[str, Any], mod: Any) -> str:
    intro = (mod.__doc__ or "").split("\n\n", 2)[2].strip()
    return f"{intro}\n\n{mod.table(r)}"


def _memory_text(r: dict[str, Any], mod: Any) -> str:
    intro = (mod.__doc__ or "").split("\n\n", 2)[2].strip()
    sizes = r["sizes"]
    rows = "\n".join(
        f"| ~{s['tokens_per_item']:,} | " + " | ".join(f"{v:,}" for v in s["breakdown"].values()) + " |"
        for s in sizes
    )
    head = " | ".join(sizes[0]["breakdown"])
    return (
        f"{intro}\n\n{mod.table(sizes)}\n\nOne waiting item's own objects (`sys.getsizeof`, bytes; what "
        "the RSS figure adds beyond these is the lanes' deques, the arrivals queue and allocator "
        f"rounding):\n\n| tokens/item | {head} |\n| ---: |{' ---: |' * len(sizes[0]['breakdown'])}\n{rows}"
    )


NOISE = (
    "The broker, the processor (or the ceiling), the drainer and librdkafka's threads compete for the "
    "same two cores, as does anything else the machine runs meanwhile (the load averages above say how "
    "busy it was). The machine's speed also drifts: the same code's CPU per item can differ by half "
    "between runs an hour apart, with no steal time reported inside the VM (/proc/stat), so the cause "
    "is not visible from here. Absolute rates move by tens of percent from one repetition to the next. "
    "That is why the two sides alternate and the ratio is taken per pair, why each "
    "figure is a median with its range, and why CPU microseconds per item (steadier than wall time "
    "under load) are shown beside the rates. Single figures without a range are single runs."
)


# -- main -------------------------------------------------------------------------------------------


def source_note() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "processor"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"commit {commit}" + (" plus uncommitted changes in processor/" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness, not the speed")
    p.add_argument("--bootstrap", help="host:port (default: $KAFKA_BOOTSTRAP or the local broker)")
    p.add_argument("--own-broker", action="store_true", help=f"start a fresh broker in {OWN_BROKER_DIR}")
    p.add_argument("--skip", help=f"comma-separated, of {','.join(BENCHES)}")
    p.add_argument("--pipeline-args", help="extra arguments for bench_pipeline.py, e.g. '--reps 5'")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md", help="the document")
    p.add_argument("--json", type=Path, help="also write every result here")
    p.add_argument("--source-note", help="what code was measured (default: the git commit)")
    p.add_argument("--render", type=Path, metavar="JSON", help="only rewrite --out from a saved --json")
    args = p.parse_args(argv)

    def log(text: str) -> None:
        print(text, flush=True)

    if args.render:
        saved = json.loads(args.render.read_text())
        args.out.write_text(render(saved, saved.pop("meta"), preserved_sections(args.out)))
        log(f"wrote {args.out}")
        return 0

    needs_kafka = bool({"pipeline", "restore"} - set((args.skip or "").split(",")))
    bootstrap, broker_note, stop = _broker(args, needs_kafka)
    try:
        results = run_all(args, bootstrap, log)
    finally:
        stop()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "smoke": args.smoke,
        "own_broker": args.own_broker,
        "machine": machine(),
        "versions": versions(bootstrap),
        "broker_note": broker_note,
        "source_note": args.source_note or source_note(),
        "invocation": " ".join(["python", "benchmarks/run_all.py", *_invocation(argv)]),
    }
    if args.own_broker:
        from processor.local.jars import KAFKA_VERSION

        meta["versions"]["broker"] = f"Apache Kafka {KAFKA_VERSION}"
    args.out.write_text(render(results, meta, preserved_sections(args.out)))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


def _invocation(argv: list[str] | None) -> list[str]:
    """This run's arguments, less where the results went and the note about the code."""
    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in ("--out", "--json", "--source-note"):
            skip = True
        elif a.startswith(("--out=", "--json=", "--source-note=")):
            continue
        else:
            out.append(repr(a) if " " in a else a)
    return _printable(out)


def _broker(args: argparse.Namespace, needed: bool) -> tuple[str | None, str, Callable[[], None]]:
    """(bootstrap, how it was obtained, how to let it go)."""
    if not needed:
        return None, "not used", lambda: None
    if args.own_broker:
        from processor.local.broker import start_broker, stop_broker

        info = start_broker(OWN_BROKER_DIR)

        def stop() -> None:
            stop_broker(OWN_BROKER_DIR)

        return info.bootstrap, f"started for this run by `processor.local.broker` in {OWN_BROKER_DIR}", stop
    from processor.kafka.config import client_config
    from processor.local.broker import local_bootstrap

    bootstrap = client_config(args.bootstrap, fallback=local_bootstrap)["bootstrap.servers"]
    return bootstrap, f"an already running broker at {bootstrap}, shared with other work", lambda: None


if __name__ == "__main__":
    sys.exit(main())
