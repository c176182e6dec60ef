"""``produce --tokens``: which token ids a replay sends (the Kafka side is a recording stand-in)."""

from __future__ import annotations

import struct

from processor.cli.produce import _replay
from processor.sim.traces import read_shipped


class Recorder:
    """Records what ``_replay`` sends; ``close``/``poll`` are what it calls on a TokenProducer."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.sent_tokens = 0

    def send(self, item_id: str, model: str, tokens: bytes, **_: object) -> int:
        self.sent.append((item_id, tokens))
        self.sent_tokens += len(tokens) // 4
        return 0

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def close(self, timeout: float = 30.0) -> None:
        return None


def test_wordpiece_tokens_stay_in_minilm_vocabulary_and_synthetic_do_not() -> None:
    records = read_shipped("templated", limit=20)
    tops = {}
    for kind in ("wordpiece", "synthetic"):
        rec = Recorder()
        _replay(rec, records, "j", None, show_progress=False, tokens=kind)  # type: ignore[arg-type]
        assert [len(t) // 4 for _, t in rec.sent] == [r.length for r in records]
        tops[kind] = max(max(struct.unpack(f"<{len(t) // 4}I", t)) for _, t in rec.sent)
    assert tops["wordpiece"] < 30522 < tops["synthetic"]
