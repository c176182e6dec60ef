"""PNG charts, for people who would rather look than read: every bar carries its value.

* :func:`plot_simulation` (``simulate --plot``): the policies of a simulation side by side, in virtual
  time: padding waste (log scale, so lanes' hundredths of a percent stand beside fifo's tens), cache
  hit rate, waiting tokens and lanes in use over time (one line style per policy, all in one legend),
  and each consumer's budget fill, with the note that lanes trade fill for waste.
* :func:`plot_measured` (``demo --plot``): the demo's two measured runs, tokenfabric and the plain
  queue, one small panel per figure so that each scale suits its numbers.

matplotlib is an optional dependency (``pip install tokenfabric[plot]``); only this module imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from processor.core.measures import budget_fill
from processor.sim.report import SimReport

FILL_NOTE = (
    "budget fill = padded tokens / (batches x budget). Lanes keep each batch to one shape and one length,\n"
    "so they send smaller batches that are not padded: lower fill, far less waste."
)
_LINE_STYLES = ("-", "--", "-.", ":")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install 'tokenfabric[plot]'") from exc
    return plt


def _label_bars(ax: Any, bars: Any, texts: Sequence[str]) -> None:
    for bar, text in zip(bars, texts, strict=True):
        ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize="small",
            xytext=(0, 2),
            textcoords="offset points",
        )


def _pct(value: float) -> str:
    """A percentage with the digits a small value needs (0.03%, 8.1%, 51%)."""
    p = 100 * value
    if p == 0:
        return "0%"
    if p < 0.1:
        return f"{p:.3f}%"
    if p < 10:
        return f"{p:.2f}%"
    return f"{p:.1f}%"


def _log_waste(ax: Any, names: Sequence[str], values: Sequence[float], colors: Any) -> None:
    """Padding waste on a log axis (a floor of 0.001% stands for 0, labelled as such)."""
    floor = 1e-3
    bars = ax.bar(names, [max(floor, 100 * v) for v in values], color=colors)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, max(200.0, 100 * max(values, default=0) * 5))
    _label_bars(ax, bars, [_pct(v) for v in values])
    ax.set_title("padding waste (% of padded tokens, log scale)", fontsize="medium")


def plot_simulation(reports: Sequence[SimReport], path: str, trace: str = "") -> None:
    """Four panels comparing the policies of ``reports``; ``trace`` names the workload in the title."""
    plt = _pyplot()
    names = [r.label for r in reports]
    colors = [f"C{i}" for i in range(len(reports))]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    waste, cache, lanes, fill = axes[0][0], axes[0][1], axes[1][0], axes[1][1]

    _log_waste(waste, names, [r.padding_waste for r in reports], colors)
    bars = cache.bar(names, [100 * r.cache_hit_rate for r in reports], color=colors)
    _label_bars(cache, bars, [_pct(r.cache_hit_rate) for r in reports])
    cache.set_title("prefix-cache hit rate (% of batches)")
    cache.set_ylim(0, 110)

    handles = []
    for i, r in enumerate(reports):
        t = [s.t_ms / 1000 for s in r.samples]
        (h,) = lanes.plot(
            t,
            [s.waiting_tokens for s in r.samples],
            color=colors[i],
            linestyle=_LINE_STYLES[i % len(_LINE_STYLES)],
            linewidth=1.5 + 0.5 * (len(reports) - i),
            alpha=0.8,
            label=f"{r.label}: waiting tokens",
        )
        handles.append(h)
    lanes.set_title("waiting tokens (left) and lanes in use (right) over virtual time (s)")
    lanes.set_ylabel("waiting tokens")
    lanes_axis = lanes.twinx()
    for r in reports:
        if r.policy == "lanes":
            (h,) = lanes_axis.plot(
                [s.t_ms / 1000 for s in r.samples],
                [s.lanes_in_use for s in r.samples],
                color="black",
                linestyle=":",
                label=f"{r.label}: lanes in use (right axis)",
            )
            handles.append(h)
            lanes_axis.set_ylabel("lanes in use")
    lanes.legend(handles=handles, loc="upper right", fontsize="small")

    consumers = sorted({c for r in reports for c in r.consumers})
    width = 0.8 / max(1, len(consumers))
    for i, name in enumerate(consumers):
        values = []
        for r in reports:
            f = r.consumers.get(name)
            values.append((budget_fill(f.fill_padded_tokens, f.budget_tokens) or 0.0) if f else 0.0)
        bars = fill.bar(
            [x + i * width for x in range(len(reports))], [100 * v for v in values], width, label=name
        )
        _label_bars(fill, bars, [f"{100 * v:.0f}%" for v in values])
    fill.set_xticks([x + width * (len(consumers) - 1) / 2 for x in range(len(reports))], names)
    fill.set_title("budget fill per consumer (%)")
    fill.set_ylim(0, 115)
    fill.legend(fontsize="small", loc="upper left")

    where = f"{trace}: " if trace else ""
    fig.suptitle(f"{where}{reports[0].items:,} items through every policy, simulated (virtual time)")
    for ax in (cache, lanes, fill):
        ax.title.set_fontsize("medium")
    fig.text(0.01, 0.005, FILL_NOTE, fontsize="small", va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: (key of a run's figures, panel title, how a value is written, log scale)
_MEASURED_PANELS: tuple[tuple[str, str, str, bool], ...] = (
    ("real_tokens_per_s", "real tokens/s (higher is better)", "{:,.0f}", False),
    ("makespan_s", "makespan, first produce to last completion (s)", "{:,.1f} s", False),
    ("padding_waste", "padding waste (% of padded tokens, log scale)", "pct", True),
    ("budget_fill", "budget fill (% of the card's budget)", "pct", False),
    ("shape_switches", "shape switches", "{:,.0f}", False),
    ("cache_hit_rate", "prefix-cache hit rate, modelled (% of batches)", "pct", False),
)


def plot_measured(runs: Mapping[str, Mapping[str, Any]], path: str, title: str) -> None:
    """The demo's runs side by side (``runs``: name -> the figures of its ``--json`` entry)."""
    plt = _pyplot()
    names = list(runs)
    colors = ["tab:blue", "tab:gray", "tab:orange", "tab:green"][: len(names)]
    fig, axes = plt.subplots(2, 3, figsize=(14, 8))
    for ax, (key, panel, form, log) in zip(axes.flat, _MEASURED_PANELS, strict=True):
        values = [float(runs[n][key]) for n in names]
        if log:
            _log_waste(ax, names, values, colors)
            continue
        pct = form == "pct"
        bars = ax.bar(names, [100 * v if pct else v for v in values], color=colors)
        _label_bars(ax, bars, [_pct(v) if pct else form.format(v) for v in values])
        top = max((100 * v if pct else v for v in values), default=0.0)
        ax.set_ylim(0, (110 if pct else top * 1.2) or 1)
        ax.set_title(panel, fontsize="medium")
    first = runs[names[0]]
    fig.suptitle(
        f"{title}: {first['items']:,} items, engine {first['engine']}; the same cards, the same items"
    )
    fig.text(0.01, 0.005, FILL_NOTE, fontsize="small", va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
