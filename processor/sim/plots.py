"""PNG charts of simulation reports, for people who would rather look than read.

One figure, four panels: padding waste and cache hit rate per policy side by side, lanes in use and
waiting tokens over (virtual) time, and each consumer's budget fill per policy. matplotlib is an
optional dependency (``pip install tokenfabric[plot]``); only this module imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from processor.sim.report import SimReport


def plot_simulation(reports: Sequence[SimReport], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install 'tokenfabric[plot]'") from exc

    names = [r.policy for r in reports]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    waste, cache, lanes, fill = axes[0][0], axes[0][1], axes[1][0], axes[1][1]

    waste.bar(names, [100 * r.padding_waste for r in reports], color="tab:red")
    waste.set_title("padding waste (% of padded tokens)")
    cache.bar(names, [100 * r.cache_hit_rate for r in reports], color="tab:green")
    cache.set_title("prefix-cache hit rate (% of batches)")
    cache.set_ylim(0, 100)

    for r in reports:
        t = [s.t_ms / 1000 for s in r.samples]
        lanes.plot(t, [s.waiting_tokens for s in r.samples], label=f"{r.policy}: waiting tokens")
    lanes.set_title("waiting tokens over virtual time (s)")
    lanes_axis = lanes.twinx()
    for r in reports:
        if r.policy == "lanes":
            lanes_axis.plot(
                [s.t_ms / 1000 for s in r.samples],
                [s.lanes_in_use for s in r.samples],
                color="black",
                linestyle=":",
                label="lanes in use",
            )
            lanes_axis.set_ylabel("lanes in use")
    lanes.legend(loc="upper right", fontsize="small")

    consumers = sorted({c for r in reports for c in r.consumers})
    width = 0.8 / max(1, len(consumers))
    for i, name in enumerate(consumers):
        values = []
        for r in reports:
            f = r.consumers.get(name)
            values.append(100 * f.fill_padded_tokens / f.budget_tokens if f and f.budget_tokens else 0.0)
        fill.bar([x + i * width for x in range(len(reports))], values, width, label=name)
    fill.set_xticks([x + width * (len(consumers) - 1) / 2 for x in range(len(reports))], names)
    fill.set_title("budget fill per consumer (%)")
    fill.set_ylim(0, 100)
    fill.legend(fontsize="small")

    fig.suptitle(f"{reports[0].items:,} items")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
