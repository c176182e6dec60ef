"""The command table (processor/cli/tokenfabric.py): a bad argument to any command is one stderr line and
exit 2, no broker needed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from processor import cli
from processor.cli.tokenfabric import main

# ------------------------------------------------------------------------------------------------
# CLI: one stderr line, exit 2, no broker needed

CARD = ["consumer", "--id", "c1", "--model", "m", "--budget", "64", "--items", "4"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["consumer", "--id", "c1", "--budget", "100", "--items", "4"], "--model required"),
        (["consumer", "--id", "c1", "--model", "m", "--budget", "0", "--items", "4"], "budget_tokens"),
        (
            ["consumer", "--id", "c1", "--model", "m", "--budget", "64", "--items", "4", "--engine", "gpu"],
            "invalid choice: 'gpu'",
        ),
        (
            ["consumer", "--id", "c1", "--model", "m", "--budget", "64", "--items", "4", "--tps", "fast"],
            "tps='fast' is not a number",
        ),
        (["consumer", "--id", "bad id", "--model", "m", "--budget", "64", "--items", "4"], "--id 'bad id'"),
        ([*CARD, "--max-batches", "0"], "--max-batches must be >= 1"),
        ([*CARD, "--engine-opt", "novalue"], "expected KEY=VALUE"),
        (["consumer", "--model", "m"], "the following arguments are required: --id"),
        ([*CARD, "--completions", "each"], "argument --completions: invalid choice: 'each'"),
        (["produce", "--trace", "/nonexistent/trace.jsonl"], "no such file"),
        (["produce", "--trace", "x.jsonl", "--speed", "2", "--backlog"], "not allowed with argument"),
        (["produce", "--trace", "mooncake_synthetic", "--limit", "0"], "--limit must be >= 1"),
        (["produce", "--trace", "mooncake_synthetic", "--speed", "-1"], "--speed must be > 0"),
        (["produce", "--trace", "mooncake_synthetic", "--format", "csv"], "invalid choice: 'csv'"),
        (["produce", "--trace", "mooncake_synthetic", "--topic-prefix", "a b"], "--topic-prefix 'a b'"),
        (["topics", "create", "--ingest-partitions", "0"], "--ingest-partitions must be >= 1"),
        (["topics", "delete"], "invalid choice: 'delete'"),
        (["topics", "create", "--consumer", "no/slash"], "--consumer 'no/slash'"),
        (["kafka", "reboot"], "unknown action 'reboot'"),
        (["kafka"], "no action"),
    ],
)
def test_bad_arguments_get_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    needs_kafka = argv[0] in ("consumer", "produce", "topics")
    with_broker = [*argv, "--bootstrap", "127.0.0.1:1"] if needs_kafka else argv
    try:
        code = cli.main(with_broker)
    except SystemExit as exc:  # argparse's own errors exit from inside the parser
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "d.jsonl", "--job", "a:b", "--template", "t.toml"], "job name 'a:b'"),
        (
            ["submit", "d.jsonl", "--job", "j", "--template", "t.toml", "--max-bad-rows", "5000"],
            "--max-bad-rows",
        ),
        (["submit", "CSV", "--job", "j", "--template", "TOML"], "uses column(s) 'question' that"),
        (["collect", "--job", "j", "--out", "out.txt"], "name it .jsonl or .parquet"),
        (
            ["collect", "--job", "j", "--out", "o.jsonl", "--wait", "--timeout-s", "0"],
            "--timeout-s must be > 0",
        ),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path, toml_path = tmp_path / "d.csv", tmp_path / "t.toml"
    csv_path.write_text("id,text\n1,x\n")
    toml_path.write_text('[[parts]]\nname = "q"\ntext = "{question}"\n')
    argv = [str(csv_path) if a == "CSV" else str(toml_path) if a == "TOML" else a for a in argv]
    assert main([*argv, "--bootstrap", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------------------------------------
# --version, and every default in the help


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from processor import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"tokenfabric {__version__}"


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser a person meets: each subcommand's, and the kafka actions' (processor.cli.kafka)."""
    from processor.cli.kafka import build_parser as kafka_parser
    from processor.cli.tokenfabric import COMMANDS, build_parser

    out: list[tuple[str, argparse.ArgumentParser]] = []
    for name in COMMANDS:
        sub = build_parser(name)._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
        out.append((name, sub))
    kafka = kafka_parser()
    out.append(("kafka (actions)", kafka))
    for action in kafka._subparsers._group_actions[0].choices.values():  # type: ignore[union-attr]
        out.append((f"kafka {action.prog.split()[-1]}", action))
    return out


def _shown(default: object) -> list[str]:
    """How a help text may write ``default``: 180.0 as 180, 60000 as 60000 or 60,000."""
    forms = [str(default)]
    if isinstance(default, float):
        forms.append(f"{default:g}")
    if isinstance(default, int) and not isinstance(default, bool):
        forms.append(f"{default:,}")
    return forms


def test_every_option_with_a_default_shows_it_in_its_help() -> None:
    silent = []
    checked = 0
    for where, parser in _parsers():
        for action in parser._actions:
            flags = (argparse._HelpAction, argparse._VersionAction, argparse._StoreConstAction)
            if not action.option_strings or isinstance(action, flags):
                continue  # store_true is a _StoreConstAction: its default is "off"
            if action.default in (None, argparse.SUPPRESS, [], ""):
                continue  # no default, or one the help explains in words ("default: <topic prefix>-...")
            checked += 1
            text = (action.help or "") % {"default": action.default}
            if "default" not in text or not any(form in text for form in _shown(action.default)):
                silent.append(f"{where} {action.option_strings[-1]} (default {action.default!r}): {text!r}")
    assert checked > 50
    assert silent == []
