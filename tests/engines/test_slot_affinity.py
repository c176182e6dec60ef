"""Shape-to-slot affinity (processor/engines/slot_affinity.py) and its engine options, without a server.

The real llama-server's behaviour with ``id_slot`` is tested in tests/local/test_llm_slot_affinity.py.
"""

from __future__ import annotations

import pytest

from processor.engines.openai_options import parse_options
from processor.engines.slot_affinity import SlotAffinity


def test_a_shape_keeps_its_slot_and_new_shapes_take_free_slots_first() -> None:
    slots = SlotAffinity(3)
    assert [slots.slot(s) for s in (10, 20, 10, 30, 20)] == [0, 1, 0, 2, 1]


def test_a_fourth_shape_takes_the_least_recently_used_slot() -> None:
    slots = SlotAffinity(3)
    for shape in (10, 20, 30, 10):  # 20 is now the least recently used
        slots.slot(shape)
    assert slots.slot(40) == 1
    assert slots.slot(20) == 2  # 20 lost its slot; the least recently used now is 30's
    assert {slots.slot(s) for s in (10, 40, 20)} == {0, 1, 2}  # never two shapes on one slot


def test_no_slots_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least 1 slot"):
        SlotAffinity(0)


def test_the_options_parse_and_slot_affinity_is_llama_cpps_only() -> None:
    s = parse_options({"url": "http://h:1", "server": "llamacpp", "ignore_eos": "true", "slot_affinity": "4"})
    assert (s.ignore_eos, s.slot_affinity) == (True, 4)
    d = parse_options({"url": "http://h:1"})
    assert (d.ignore_eos, d.slot_affinity) == (False, 0)
    with pytest.raises(ValueError, match="slot_affinity is for server=llamacpp, not server=vllm"):
        parse_options({"url": "http://h:1", "server": "vllm", "slot_affinity": "4"})
    with pytest.raises(ValueError, match="ignore_eos='yes' is not one of false, true"):
        parse_options({"url": "http://h:1", "ignore_eos": "yes"})
