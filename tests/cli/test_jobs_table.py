"""``tokenfabric jobs``' table (processor/sim/columns.py): whole where it fits the terminal, else in
parts that do."""

from __future__ import annotations

from processor.sim.columns import fitted

HEADER = (
    "job", "state", "rows", "bad", "ok", "failed", "missing", "tokens in", "counted",
    "share", "routed", "padded", "cached",
)  # fmt: skip
ROWS = [
    HEADER,
    ("reviews-1", "finished", "5", "1", "4", "0", "0", "251", "12-03 17:19", "weight 1", "251", "264", "-"),
    (
        "support-tickets-2026-12", "submitted", "120,000", "3", "80,211", "2", "39,784", "9,512,770",
        "12-03 18:02", "weight 2, max 5,000 tokens/s", "6,354,112", "6,371,020", "93.8%",
    ),
]  # fmt: skip
LEFT = (0, 1, 8, 9)


def test_a_wide_terminal_gets_one_table() -> None:
    wide = fitted(ROWS, 200, LEFT)
    assert len(wide) == 3 and wide[0].split()[-4:] == ["share", "routed", "padded", "cached"]


def test_a_narrow_terminal_gets_parts_no_wider_than_it_each_with_whole_job_names() -> None:
    for width in (80, 120):
        narrow = fitted(ROWS, width, LEFT)
        assert max(len(line) for line in narrow) <= width, "\n".join(narrow)
        parts = "\n".join(narrow).split("\n\n")
        assert len(parts) >= 2
        for part in parts:
            lines = part.splitlines()
            assert lines[0].startswith("job ") and lines[2].startswith("support-tickets-2026-12 ")
        columns = [c for part in parts for c in part.splitlines()[0].split("  ") if c.strip()]
        assert [c.strip() for c in columns if c.strip() != "job"] == list(HEADER[1:])  # each column once
