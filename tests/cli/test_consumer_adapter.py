"""``tokenfabric consumer --adapter`` (processor/cli/consumer.py): the contract it announces names the
adapter's serving key, and a name holding the key's separator fails in one line."""

from __future__ import annotations

import argparse

import pytest

from processor.cli.consumer import _contract, configure
from tests.cli.helpers import run_cli


def parsed(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    configure(p)
    return p.parse_args(["--id", "card-tone", "--budget", "4096", "--items", "8", *argv])


def test_the_contract_of_an_adapters_consumer_names_its_serving_key() -> None:
    assert _contract(parsed("--model", "llama", "--adapter", "support-tone")).model == "llama@support-tone"
    assert _contract(parsed("--model", "llama")).model == "llama"  # no --adapter: the base model
    assert _contract(parsed("--model", "llama", "--adapter", "")).model == "llama"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "llama@v2"], "--model 'llama@v2' contains '@'"),
        (["--model", "llama", "--adapter", "tone@v2"], "--adapter 'tone@v2' contains '@'"),
    ],
)
def test_a_name_holding_the_separator_fails_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, _out, err = run_cli(
        capsys,
        "consumer",
        "--id",
        "c1",
        "--budget",
        "64",
        "--items",
        "8",
        *argv,
        "--bootstrap",
        "127.0.0.1:1",
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err and "model@adapter" in err
