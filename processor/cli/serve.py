"""One way to serve a long-running app from the command line: ``tokenfabric processor``, ``consumer``
and ``collector`` each run one app until a signal, and share this frame around it.

:class:`Serving` is that frame, used as a context manager:

- **signals**: entering installs the stop handlers (the app's ``run(stop)`` sees the event set on
  SIGTERM/SIGINT); leaving puts back the handlers that were there before;
- **readiness**: :meth:`Serving.cluster_answered` waits for the cluster
  (processor.kafka.reach.wait_for_cluster: said once, retried until a broker answers) and says
  ``stopped before Kafka answered`` when the stop came first (the command then exits 0);
- **HTTP**: :meth:`Serving.serve_http` starts ``/metrics``, ``/healthz`` and ``/readyz``
  (processor.ops.health); leaving closes the server, so it lives exactly as long as the app;
- **exit codes**: :func:`printed_exit` and :func:`logged_exit` turn how the app ended into the exit
  status (processor.kafka.exits: 75 a restart recovers, 78 a newer twin took over, 2 wrong settings,
  1 otherwise), said on stderr or in the log as the command always has.

Why here, in ``cli/``: the frame prints the command's own ``PROG: error:`` lines and installs the
stop handlers of processor.cli.options; the apps below know nothing of processes or signals.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from processor.cli.options import set_from_signal
from processor.kafka.exits import EXIT_SUPERSEDED, EXIT_TEMPFAIL, EXIT_USAGE, exit_code
from processor.kafka.reach import wait_for_cluster

if TYPE_CHECKING:  # the collector serves no HTTP: it need not load prometheus_client
    from prometheus_client import CollectorRegistry

    from processor.ops.health import HealthCheck, HttpSettings, ObservabilityServer

#: The signals that stop a long-running command.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: What prints every thread's stack on stderr while the command runs on (docs/operations.md).
STACKS_SIGNAL = signal.SIGUSR2

#: Installs a command's stop handlers: each sets the event (and may do more, see
#: processor.cli.options.install_stop_handlers, whose second signal aborts).
StopHandlers = Callable[[threading.Event], None]


def stop_on_signals(stop: threading.Event) -> None:
    """Every SIGTERM/SIGINT sets ``stop``; the app finishes what it does and returns."""
    if threading.current_thread() is not threading.main_thread():
        return  # signals are delivered to the main thread only; an embedding caller owns them
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: set_from_signal(stop))


class Serving:
    """The frame of one long-running command around its app (see the module docstring).

    ``prog`` begins the lines it prints (``tokenfabric consumer: error: ...``); ``log`` is the
    command's logger; ``stop_handlers`` installs what SIGTERM/SIGINT do; ``said_on_stderr``: the
    command says ``stopped before Kafka answered`` on stderr after ``prog`` rather than in its log.
    """

    def __init__(
        self,
        prog: str,
        log: logging.Logger,
        stop_handlers: StopHandlers = stop_on_signals,
        *,
        said_on_stderr: bool = False,
    ) -> None:
        self.prog = prog
        self.log = log
        self.stop = threading.Event()
        self.server: ObservabilityServer | None = None
        self._stop_handlers = stop_handlers
        self._said_on_stderr = said_on_stderr
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> Serving:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
            # ``kill -USR2 PID``: every thread's stack on stderr, the process going on (a call that
            # never returns is found this way, where a debugger cannot be attached: a pod, CI)
            faulthandler.register(STACKS_SIGNAL, file=2, all_threads=True)  # fd 2: whatever sys.stderr is
        self._stop_handlers(self.stop)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._previous:
            faulthandler.unregister(STACKS_SIGNAL)
        self._previous = {}

    def error(self, exc: object, hint: str = "") -> None:
        """The command's one error line on stderr."""
        print(f"{self.prog}: error: {exc}{hint}", file=sys.stderr)

    def cluster_answered(self, conf: Mapping[str, str]) -> bool:
        """Wait until the cluster answers: True then; False, said once, when the stop came first."""
        if wait_for_cluster(conf, self.stop, self.log):
            return True
        if self._said_on_stderr:
            print(f"{self.prog}: stopped before Kafka answered", file=sys.stderr)
        else:
            self.log.info("stopped before Kafka answered")
        return False

    def serve_http(
        self, settings: HttpSettings | None, registry: CollectorRegistry, health: HealthCheck
    ) -> bool:
        """Serve ``registry`` and ``health`` as ``settings`` say (None: not at all) until the frame is
        left. False, with the error line, when a port given on the command line cannot be bound: the
        command then exits 2."""
        from processor.ops.health import start_http

        try:
            self.server = start_http(settings, registry, health)
        except OSError as exc:
            self.error(exc)
            return False
        return True


def printed_exit(prog: str, exc: BaseException) -> int:
    """One line on stderr, and the exit code that says whether a restart recovers (processor.kafka.exits)."""
    code = exit_code(exc)
    hint = f" (exit {EXIT_TEMPFAIL}: a restart recovers)" if code == EXIT_TEMPFAIL else ""
    print(f"{prog}: error: {exc}{hint}", file=sys.stderr)
    _leave_if_stuck(exc, code)
    return code


def _leave_if_stuck(exc: BaseException, code: int) -> None:
    """A run stuck in librdkafka (:class:`~processor.kafka.outage.StuckCall`) holds a thread and
    clients the interpreter cannot finish at exit: leave at once, as the watchdog did before the
    ride (processor/kafka/watchdog.py), with the code already said."""
    from processor.kafka.outage import StuckCall

    if isinstance(exc, StuckCall):
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)


def logged_exit(log: logging.Logger, exc: BaseException) -> int:
    """The exit code of a failure the command expects, said in its log: wrong settings (2), a newer
    twin (78), a failure a restart recovers from (75). Anything else is raised again (a bug or a
    fatal error: the traceback is logged and the command exits 1)."""
    code = exit_code(exc)
    if code == EXIT_USAGE:
        log.error("%s (exit %d)", exc, code)
    elif code == EXIT_SUPERSEDED:
        log.error("%s", exc)
    elif code == EXIT_TEMPFAIL:
        log.error("%s: exiting with %d, a restart recovers from the last commit", exc, code)
        _leave_if_stuck(exc, code)
    else:
        raise exc
    return code
