"""The frame the long-running commands share (processor/cli/serve.py): signals set the stop event and
are put back, the HTTP server lives as long as the frame, and failures map to the exit codes of
processor/kafka/exits.py with the lines the commands have always written. The commands themselves:
test_waiting.py, test_consumer.py, tests/broker/test_foreseeable_errors.py."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from processor.cli.serve import STACKS_SIGNAL, Serving, logged_exit, printed_exit
from processor.kafka.exits import (
    EXIT_SUPERSEDED,
    EXIT_TEMPFAIL,
    EXIT_USAGE,
    Superseded,
    TransientFailure,
    WrongSettings,
)
from processor.ops.health import HttpSettings, ObservabilityServer, ServingHealth

LOG = logging.getLogger("tokenfabric.test-serve")


def test_a_stop_signal_sets_the_event_and_leaving_puts_the_handlers_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with Serving("tokenfabric test", LOG) as serving:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and handler is not before[signal.SIGTERM]
        handler(signal.SIGTERM, None)
        assert serving.stop.is_set()
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_sigusr2_prints_every_threads_stack_while_serving_and_not_after(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with Serving("tokenfabric test", LOG):
        os.kill(os.getpid(), STACKS_SIGNAL)
        time.sleep(0.1)
        said = capfd.readouterr().err
        assert "Current thread" in said and "test_serve.py" in said, said
    assert faulthandler.unregister(STACKS_SIGNAL) is False  # the frame took its handler back


def test_the_server_lives_as_long_as_the_frame() -> None:
    with Serving("tokenfabric test", LOG) as serving:
        assert serving.serve_http(
            HttpSettings("127.0.0.1", 0, explicit=True), CollectorRegistry(), ServingHealth()
        )
        server = serving.server
        assert server is not None
        with urllib.request.urlopen(server.url + "/healthz", timeout=5) as answer:
            assert answer.status == 200
    assert serving.server is None
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url + "/healthz", timeout=5)


def test_a_port_given_that_cannot_be_bound_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    first = ObservabilityServer(CollectorRegistry(), ServingHealth(), "127.0.0.1", 0)
    try:
        with Serving("tokenfabric test", LOG) as serving:
            taken = HttpSettings("127.0.0.1", first.port, explicit=True)
            assert not serving.serve_http(taken, CollectorRegistry(), ServingHealth())
    finally:
        first.close()
    err = capsys.readouterr().err
    assert err.startswith(f"tokenfabric test: error: --metrics-port {first.port}") and err.count("\n") == 1


def test_printed_exit_says_when_a_restart_recovers(capsys: pytest.CaptureFixture[str]) -> None:
    assert printed_exit("tokenfabric test", TransientFailure("topics missing")) == EXIT_TEMPFAIL
    assert printed_exit("tokenfabric test", Superseded("a twin")) == EXIT_SUPERSEDED
    assert capsys.readouterr().err.splitlines() == [
        f"tokenfabric test: error: topics missing (exit {EXIT_TEMPFAIL}: a restart recovers)",
        "tokenfabric test: error: a twin",
    ]


def test_logged_exit_logs_what_it_expects_and_raises_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("ERROR", logger=LOG.name):
        assert logged_exit(LOG, WrongSettings("wrong group")) == EXIT_USAGE
        assert logged_exit(LOG, Superseded("a twin")) == EXIT_SUPERSEDED
        assert logged_exit(LOG, TransientFailure("gone")) == EXIT_TEMPFAIL
    assert [r.getMessage() for r in caplog.records] == [
        f"wrong group (exit {EXIT_USAGE})",
        "a twin",
        f"gone: exiting with {EXIT_TEMPFAIL}, a restart recovers from the last commit",
    ]
    bug = RuntimeError("a ledger that does not balance")
    with pytest.raises(RuntimeError) as raised:
        logged_exit(LOG, bug)
    assert raised.value is bug  # its traceback is logged and the command exits 1
