"""ProcessorSettings refuse what cannot work, with the one line the CLI prints for the same flag
(processor/apps/settings.py): a library user and ``tokenfabric processor`` get the same error."""

from __future__ import annotations

import re

import pytest

from processor.apps.settings import ConsumerSettings, PlainQueueSettings, ProcessorSettings
from tests.cli.helpers import run_cli


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"instance": ""}, "--instance (instance) must not be empty"),
        ({"consume_batch": 0}, "consume_batch must be >= 1, got 0"),
        ({"poll_timeout_ms": -1}, "poll_timeout_ms must be >= 0, got -1"),
        ({"commit_interval_ms": 0}, "--commit-interval-ms must be >= 1"),
        ({"eager_commit_ms": -5}, "eager_commit_ms must be >= 0, got -5"),
        ({"tick_interval_ms": 0}, "tick_interval_ms must be >= 1, got 0"),
        ({"max_waiting_tokens": -1}, "--max-waiting-tokens must be >= 0 (0 means no cap)"),
        ({"session_timeout_ms": 999}, "--session-timeout-ms must be >= 1000"),
        ({"dedupe_window_ms": -1}, "--dedupe-window-ms and --dedupe-max-ids must be >= 0"),
        ({"dedupe_max_ids": -1}, "--dedupe-window-ms and --dedupe-max-ids must be >= 0"),
        (
            {"transaction_timeout_ms": 500, "commit_interval_ms": 500},
            "--transaction-timeout-ms must be longer than --commit-interval-ms",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_with_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ProcessorSettings(**fields)  # type: ignore[arg-type]


def test_the_defaults_are_valid() -> None:
    assert ProcessorSettings().commit_interval_ms == 500


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--commit-interval-ms", "0"], "--commit-interval-ms must be >= 1"),
        (["--session-timeout-ms", "10"], "--session-timeout-ms must be >= 1000"),
        (
            ["--transaction-timeout-ms", "400"],
            "--transaction-timeout-ms must be longer than --commit-interval-ms",
        ),
    ],
)
def test_the_cli_prints_the_settings_own_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    def reached(*_args: object) -> bool:
        raise AssertionError("the command went on to look for Kafka: the flag was not refused")

    monkeypatch.setattr("processor.kafka.reach.wait_for_cluster", reached)
    code, _out, err = run_cli(capsys, "processor", "--bootstrap", "127.0.0.1:1", *flags)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"tokenfabric processor: error: {message}")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ConsumerSettings(max_batches=0), "--max-batches must be >= 1, got 0"),
        (lambda: ConsumerSettings(idle_exit_s=0), "--idle-exit-s must be > 0, got 0"),
        (
            lambda: ConsumerSettings(completions="each"),
            "--completions must be one of batch, item, got 'each'",
        ),
        (lambda: ConsumerSettings(max_completion_bytes=0), "max_completion_bytes must be >= 1, got 0"),
        (lambda: PlainQueueSettings(linger_ms=0), "--linger-ms must be > 0, got 0"),
        (lambda: PlainQueueSettings(idle_exit_s=-1), "--idle-exit-s must be > 0, got -1"),
    ],
)
def test_consumer_and_plain_queue_settings_refuse_what_cannot_work(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build()  # type: ignore[operator]


def test_the_consumer_app_refuses_bad_settings_as_its_cli_does(capsys: pytest.CaptureFixture[str]) -> None:
    from processor.apps.consumer import ConsumerApp
    from processor.engines.base import make_engine
    from processor.kafka.topics import TopicNames
    from tests.apps.helpers import card_contract

    with pytest.raises(ValueError, match=re.escape("--max-batches must be >= 1, got 0")):
        ConsumerApp(
            {}, TopicNames(), card_contract(), make_engine("sim", {}), ConsumerSettings(max_batches=0)
        )
    code, _out, err = run_cli(
        capsys,
        "consumer",
        "--id",
        "c",
        "--model",
        "m",
        "--budget",
        "64",
        "--items",
        "2",
        "--max-batches",
        "0",
    )
    assert code == 2 and "--max-batches must be >= 1, got 0" in err
