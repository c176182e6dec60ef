"""The delivery modes' roles stay small: no protocol in processor/state has more than 10 members, and
the at-least-once composition is made of its own roles (null objects where it has nothing to do)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any, Protocol

import processor.state
from processor.kafka.topics import TopicNames
from processor.state import modes
from processor.state.dedupe import NoDedupe
from processor.state.durability import CommitClients, PlainCommits
from processor.state.lane_log import NoInFlightLog, OffsetLog
from processor.state.ownership import StaysWithInstance
from processor.state.placement import AllSlots


def protocols() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(processor.state.__path__):
        module = importlib.import_module(f"processor.state.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and Protocol in obj.__mro__[1:]:
                found[f"{info.name}.{name}"] = obj
    return found


def members(proto: type) -> set[str]:
    own = {n for n in vars(proto) if not n.startswith("_")}
    return own | set(getattr(proto, "__annotations__", {}))


def test_no_protocol_in_state_has_more_than_ten_members() -> None:
    found = protocols()
    assert {"durability.Durability", "lane_log.LaneLog", "ownership.Restorable"} <= set(found)
    too_big = {name: len(members(p)) for name, p in found.items() if len(members(p)) > 10}
    assert too_big == {}


def test_the_at_least_once_mode_is_its_own_roles_and_the_null_ones() -> None:
    none: Any = None
    mode = modes.at_least_once(CommitClients(none, none, none), TopicNames("roles"), "p0", 100)
    assert isinstance(mode.durability, PlainCommits) and isinstance(mode.lane_log, OffsetLog)
    assert isinstance(mode.ownership, StaysWithInstance)
    assert isinstance(mode.in_flight, NoInFlightLog) and isinstance(mode.dedupe, NoDedupe)
    assert isinstance(mode.placement, AllSlots)
    assert mode.lane_log.offsets is mode.ownership.offsets is mode.durability.offsets  # one tracker
