"""Sweep the lane settings over the shipped traces (backlog replays, default cards).

Prints a markdown table of padding waste / budget fill / new lanes per trace for each setting, the
measurement behind LaneSettings' defaults (docs/lanes.md). The listed settings are the first
generation's narrow lanes (cut in arrival order, absolute deadline, no spread); the last row is
today's defaults (one lane per shape, cut by length). Run: python benchmarks/sweep_lanes.py
"""

from __future__ import annotations

from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings
from processor.sim.simulator import DEFAULT_CONSUMERS, parse_consumer_spec, simulate
from processor.sim.traces import read_shipped

TRACES = ("mooncake_conversation", "mooncake_synthetic", "azure_code", "azure_conv")
SETTINGS = [  # floor_tokens, start_ratio, full_ratio, cap_tokens
    (16, 0.01, 0.10, 512),
    (8, 0.005, 0.10, 512),
    (8, 0.002, 0.05, 512),
    (8, 0.002, 0.05, 256),
    (0, 0.002, 0.05, 256),
    (0, 0.001, 0.02, 128),
]


def main() -> None:
    consumers = [parse_consumer_spec(s) for s in DEFAULT_CONSUMERS]
    records = {name: read_shipped(name) for name in TRACES}
    print("| floor | start | full | cap | " + " | ".join(TRACES) + " |")
    print("|---:|---:|---:|---:|" + "---|" * len(TRACES))
    first_generation = DispatchSettings(deadline="absolute", spread=False)
    rows = [
        (
            f"| {floor} | {start} | {full} | {cap} |",
            LaneSettings(
                floor_tokens=floor, start_ratio=start, full_ratio=full, cap_tokens=cap, cut="arrival"
            ),
            first_generation,
        )
        for floor, start, full, cap in SETTINGS
    ]
    rows.append(("| defaults: one lane per shape, cut by length ||||", LaneSettings(), DispatchSettings()))
    for label, lanes, dispatch in rows:
        cells = []
        for name in TRACES:
            r = simulate(records[name], consumers, "lanes", backlog=True, lanes=lanes, dispatch=dispatch)
            cells.append(f"{r.padding_waste:.3%} / {r.budget_fill:.1%} / {r.new_lanes:,}")
        print(label + " " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
