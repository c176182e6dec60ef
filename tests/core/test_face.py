"""The core's face is code, not prose: adapters, tools and tests outside the core read the scheduler
through its methods and its view (processor/core/view.py), never its state.

The state is private, one context the scheduler owns and hands to its parts (``Scheduler._context``:
the lane table, the consumers, the ledger, the shares, the endings...; core/context.py) and the
parts themselves (``_adoption``, ``_withdrawals``, ``_rules``): the type checker flags a read of the
old public names, and the scan below flags a read of the private ones anywhere outside
``processor/core`` and ``tests/core`` (the core's own white-box tests).
"""

from __future__ import annotations

import ast
from pathlib import Path

from processor.core.context import SchedulerContext
from processor.core.scheduler import Scheduler
from tests.common import ROOT

PRIVATE = frozenset({"_context", "_adoption", "_withdrawals", "_rules"})
"""The scheduler's state (its context: the lane table, the consumers' states, the ledger, the shares,
the endings...) and the parts it hands that state to."""

FORMER = ("_table", "_consumers", "_ledger", "_shares", "_endings", "_flights", "_active", "_order")
"""Where the state was before one context held it (a mixin read it off the scheduler): not to return."""

INSIDE = (ROOT / "processor" / "core", ROOT / "tests" / "core")


def private_reads(source: str) -> list[int]:
    """Lines of ``source`` that read one of :data:`PRIVATE` from anything but ``self`` (an object's
    own attribute of the same name is its own business), by attribute or by ``getattr``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr")
            and len(node.args) >= 2
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in PRIVATE
        ):
            lines.append(node.lineno)
    return sorted(lines)


def outside_the_core() -> list[Path]:
    files = [*(ROOT / "processor").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    return sorted(f for f in files if not any(f.is_relative_to(inside) for inside in INSIDE))


def test_nothing_outside_the_core_reads_the_schedulers_state() -> None:
    found = {}
    for path in outside_the_core():
        lines = private_reads(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}, f"read the scheduler's view or methods instead: {found}"


def test_the_scan_finds_a_planted_read_and_lets_an_objects_own_attribute_be() -> None:
    planted = (
        "def ok(self, svc):\n"
        "    self._context = getattr(self, '_rules', svc.core.view.total('completed'))\n"  # its own: fine
        "    return svc.core.view.job_book('j')\n"
        "def leak(svc, core):\n"
        "    a = svc.core._context.ledger.total('completed')\n"
        "    b = core._adoption.release_all()\n"
        "    return getattr(core, '_withdrawals'), a, b\n"
    )
    assert private_reads(planted) == [5, 6, 7]


def test_the_old_public_names_are_gone() -> None:
    core = Scheduler()
    for name in ("table", "consumers", "ledger", "shares", "endings"):
        assert not hasattr(core, name), f"Scheduler.{name} is public again: make it private, read the view"
    for name in PRIVATE:
        assert hasattr(core, name), f"Scheduler.{name} is gone: update PRIVATE here"


def test_the_state_has_one_owner_its_context() -> None:
    """No part keeps a reference of its own that a handover could replace under it: the scheduler,
    its view, its adoption and its withdrawals read one context, and a replaced lane table or ledger
    is replaced there for all of them."""
    core = Scheduler()
    for name in FORMER:
        assert not hasattr(core, name), f"Scheduler.{name} is back: keep the state in its context"
    context = core._context
    assert isinstance(context, SchedulerContext)
    for part in (core.view, core._adoption, core._withdrawals):
        assert part._context is context, f"{type(part).__name__} holds state of its own"
    table, ledger = context.table, context.ledger
    core.release_all()
    core.resume_ledger(ledger.snapshot())
    assert context.table is not table and context.ledger is not ledger
    assert core._context is context and core.view.lanes().lanes_in_use == 0
