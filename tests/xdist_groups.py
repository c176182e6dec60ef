"""How ``./run test`` spreads the suite over pytest-xdist workers (``-n 3 --dist loadgroup``).

Every broker test makes its own topic prefix and group ids, so nearly all of them share one broker
side by side. The exceptions, by file (tests/broker/):

- :data:`SERIAL`: a group's tests run on one worker, one at a time. ``own-broker``: tests that start
  a broker of their own (a JVM each), and test_acls with test_security, which share a secured broker
  (a session fixture). ``stacks``: the demos and the benchmark harness, whole stacks of processes.
- :data:`ALONE`: tests that time what they watch (test_alerts: no alert may fire in a clean stretch,
  so an item may not wait 14 s) run last, once every other worker is idle.

xdist's own ``xdist_group`` marker renames node ids, which pytest 9.2's ``NodeId`` no longer allows,
so :func:`scheduler` reads the groups from the file names instead.
"""

from __future__ import annotations

from typing import Any

SERIAL = {
    "test_broker_restart.py": "own-broker",
    "test_broker_outage.py": "own-broker",
    "test_kafka_upgrade.py": "own-broker",
    "test_local_broker.py": "own-broker",
    "test_local_stack.py": "own-broker",
    "test_sasl.py": "own-broker",
    "test_security.py": "own-broker",
    "test_acls.py": "own-broker",
    "test_refusals.py": "own-broker",
    "test_demo.py": "stacks",
    "test_demo_llm.py": "stacks",
    "test_benchmarks.py": "stacks",
    "test_schema_registry.py": "registry",
    "test_local_registry.py": "registry",
    "test_rebalance_fleet.py": "stacks",
}
ALONE = {"test_alerts.py": "alone"}


def group_of(nodeid: str) -> str | None:
    """The group of a node id (``tests/broker/<file>::...``), or None: any worker, any time."""
    path = nodeid.split("::", 1)[0]
    if not path.startswith("tests/broker/"):
        return None
    name = path.rsplit("/", 1)[-1]
    return SERIAL.get(name) or ALONE.get(name)


def scheduler(config: Any, log: Any) -> Any:
    """``--dist loadgroup`` over :func:`group_of`, holding the :data:`ALONE` groups back until every
    other test has run and every worker is idle."""
    from xdist.scheduler import LoadGroupScheduling

    alone = set(ALONE.values())

    class Groups(LoadGroupScheduling):  # type: ignore[misc]
        keeper: Any = None
        """The worker that runs the alone groups, once the others have finished and exited."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            others = [scope for scope in self.workqueue if scope not in alone]
            if others:  # the alone groups stay at the back of the queue
                self.workqueue.move_to_end(others[0], last=False)
                super()._assign_work_unit(node)
                return
            # Only alone groups left. A worker runs its last test only once it has more work or is
            # told to shut down, so "idle" is: every worker down to its last test.
            if self.keeper is not None or any(self._pending_of(w) > 1 for w in self.assigned_work.values()):
                return
            self.keeper = node
            for other in self.nodes:
                if other is not node and not other.shutting_down:
                    other.shutdown()
            self._release_alone()

        def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            self._release_alone()

        def _release_alone(self) -> None:
            """Once every other worker has run its last test, the keeper takes the alone groups."""
            if self.keeper is None or not self.workqueue:
                return
            if any(self._pending_of(w) for n, w in self.assigned_work.items() if n is not self.keeper):
                return
            while self.workqueue:
                super()._assign_work_unit(self.keeper)

    return Groups(config, log)
