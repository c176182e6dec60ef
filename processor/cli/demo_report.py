"""The demo's report: both runs side by side, fitted to the terminal (``tokenfabric demo``).

A ratio stands beside a figure only where dividing the two means something; ``llm`` runs show the
prefix cache's measured figures instead of padding (processor/cli/demo.py runs the pipelines).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

from processor.local.pipeline import Card
from processor.sim.traces import TraceRecord

if TYPE_CHECKING:
    from processor.local.compare import RunFigures

RUNS = ("tokenfabric", "plain-queue")
#: ``--engine llm`` also runs the share-group queue (processor/apps/sharequeue.py).
LLM_RUNS = (*RUNS, "share-queue")


def _pct(value: float) -> str:
    """A percentage with the digits a small value needs (0.003%, 0.29%, 50.4%)."""
    p = 100 * value
    return "0%" if p == 0 else f"{p:.3f}%" if p < 0.1 else f"{p:.2f}%" if p < 10 else f"{p:.1f}%"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(
    trace_name: str,
    records: list[TraceRecord],
    figures: Mapping[str, RunFigures],
    codes: Mapping[str, Mapping[str, int | None]],
    engine: str,
    cards: tuple[Card, ...],
    width: int = 100,
) -> str:
    """Both runs side by side, no line wider than ``width`` (rich folds the cells that must).

    A ratio stands beside a figure only where dividing the two means something (times, rates,
    counts), never beside a percentage. For ``llm`` the servers batch continuously and pad nothing,
    so padding and fill give way to the prefix cache's measured figures.
    """
    console = Console(record=True, width=width, file=io.StringIO())
    names = [n for n in LLM_RUNS if n in figures]
    tf = figures["tokenfabric"]
    baselines = [n for n in names if n != "tokenfabric"]
    better = min(baselines, key=lambda n: figures[n].makespan_s)  # the baseline the ratio is against
    pq = figures[better]
    tokens = sum(r.length for r in records)
    what = {
        "embed": "embed (all-MiniLM-L6-v2 on the CPU, real compute)",
        "llm": "llm (local llama-servers, a random-weight model: real prefill, KV caches and continuous "
        "batching, meaningless text)",
        "sim": "sim (modelled cards, not real compute)",
    }[engine]
    console.print(
        f"[bold]tokenfabric demo[/bold]: {len(records):,} items, {tokens:,} tokens from {trace_name}; "
        f"engine {what}; figures read back from each run's topics"
    )
    table = Table(
        title="the same items, the same two cards: tokenfabric against "
        + ("a plain Kafka queue" if len(baselines) == 1 else "plain queues (consumer group, share group)"),
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
    )
    short = better.removesuffix("-queue")
    ratio_head = f"tokenfabric / {short}" if len(names) == 2 else f"tf / {short}"  # 80 columns hold 3 runs
    for col in (
        "",
        *(n.replace("-", " ") if len(names) == 2 else n.split("-")[0] for n in names),
        ratio_head,
    ):
        table.add_column(col, justify="left" if not col else "right", no_wrap=bool(col))
    for label, fmt, ratio_of in _rows(engine):
        ratio = "" if ratio_of is None else _ratio(ratio_of(tf), ratio_of(pq))
        table.add_row(label, *(fmt(figures[n]) for n in names), ratio)
    console.print(table)
    for name in names:
        console.print(_per_card(name, figures[name], codes[name], cards, engine))
    if engine == "llm":
        console.print(
            "cached: prompt tokens each server reported served from its prefix cache; cacheable: the "
            "items' shared prefixes, what a perfect cache could serve; computed: the rest of the "
            "prompts, which the servers ran. Dispatch: when the processor (or a plain-queue card) "
            "made the item's batch."
        )
    else:
        console.print(
            "budget fill: padded tokens / (batches x budget). Lanes keep a batch to one shape and one "
            "length, so a backlog of many lengths gives many small, unpadded batches: they trade fill for "
            "waste. Cache hits are modelled (LRU of 4 shapes per card); MiniLM keeps no prefix cache."
        )
    return console.export_text()


if TYPE_CHECKING:
    #: A summary row: its label, how a run's figure prints, and what a ratio divides (None: no ratio).
    Row = tuple[str, Callable[[RunFigures], str], Callable[[RunFigures], float] | None]


def _rows(engine: str) -> list[Row]:
    """The summary's rows: label, how a run's figure prints, and what a ratio divides (None: none)."""

    def ms(q: float) -> Callable[[RunFigures], float]:
        return lambda f: f.latency_ms(q) or 0.0

    common: list[Row] = [
        ("items completed once", lambda f: f"{f.items_completed_once:,} / {f.items:,}", None),
        ("audit clean", lambda f: "yes" if f.audit_clean else "NO", None),
        ("makespan (s)", lambda f: f"{f.makespan_s:,.1f}", lambda f: f.makespan_s),
        (
            "prompt tokens/s" if engine == "llm" else "real tokens/s",
            lambda f: f"{f.real_tokens_per_s:,.0f}",
            lambda f: f.real_tokens_per_s,
        ),
    ]
    if engine == "llm":
        return [
            *common,
            ("output tokens/s", lambda f: f"{f.output_tokens_per_s:,.0f}", lambda f: f.output_tokens_per_s),
            ("total tokens/s", lambda f: f"{f.total_tokens_per_s:,.0f}", lambda f: f.total_tokens_per_s),
            ("prompt tokens", lambda f: f"{f.tokens:,}", None),
            ("output tokens", lambda f: f"{f.cards_sum('output_tokens'):,}", None),
            ("cacheable (shared prefixes)", lambda f: f"{f.prefix_tokens:,}", None),
            ("cached prompt tokens", lambda f: f"{f.cards_sum('cached_prompt_tokens'):,}", None),
            ("cached / cacheable", lambda f: _share(f.cached_share_of_prefix), None),
            (
                "prefill tokens computed",
                lambda f: f"{f.cards_sum('prefill_tokens'):,}",
                lambda f: f.cards_sum("prefill_tokens"),
            ),
            ("dispatch to completion p50 (ms)", lambda f: f"{ms(0.5)(f):,.0f}", ms(0.5)),
            ("dispatch to completion p99 (ms)", lambda f: f"{ms(0.99)(f):,.0f}", ms(0.99)),
            ("batches", lambda f: f"{f.batches:,}", lambda f: f.batches),
            ("shape switches", lambda f: f"{f.shape_switches:,}", None),
        ]
    return [
        *common,
        ("padding waste", lambda f: _pct(f.padding_waste), None),
        ("budget fill", lambda f: f"{f.budget_fill:.1%}", None),
        ("batches", lambda f: f"{f.batches:,}", lambda f: f.batches),
        ("shape switches", lambda f: f"{f.shape_switches:,}", None),
        ("cache hit rate (modelled)", lambda f: f"{f.cache_hit_rate:.1%}", None),
    ]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _per_card(
    name: str, figures: RunFigures, codes: Mapping[str, int | None], cards: tuple[Card, ...], engine: str
) -> Table:
    """One run's cards: a table per run, so that it fits 80 columns without cutting a number short
    (each card's budget is in the setup line; padded tokens are waste and real tokens' sum)."""
    per = Table(title=f"{name}: where each card's batches went", box=box.SIMPLE_HEAD, collapse_padding=True)
    gen = engine == "llm"
    measured = ("prompt tokens", "cached", "computed") if gen else ("real tokens", "waste", "fill")
    for col in ("card", "batches", "items", *measured, "shapes", "switches", "exit"):
        per.add_column(col, justify="left" if col == "card" else "right", no_wrap=" " not in col)
    for card in cards:
        c = figures.cards[card.name]
        cells = (
            (c.real_tokens, c.cached_prompt_tokens, c.prefill_tokens)
            if gen
            else (c.real_tokens, _pct(c.padding_waste), f"{c.budget_fill:.1%}")
        )
        per.add_row(
            card.name,
            f"{c.batches:,}",
            f"{c.items:,}",
            *(f"{v:,}" if isinstance(v, int) else v for v in cells),
            f"{c.shapes}",
            f"{c.shape_switches:,}",
            str(codes.get(card.name)),
        )
    return per
