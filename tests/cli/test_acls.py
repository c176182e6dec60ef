"""``tokenfabric acls``: prints, creates or deletes; ``--dry-run`` says what would change and connects to
nothing; a prefix or ``--group`` that another pipeline's ACLs could cover is refused in one line.
Creating and deleting against an authorizer: tests/broker/test_refusals.py and test_acls.py."""

from __future__ import annotations

import pytest

from processor.kafka.acls import acls_for, distinct
from processor.kafka.topics import TopicNames
from tests.cli.helpers import run_cli

NOWHERE = ["--bootstrap", "127.0.0.1:1"]  # a dry run that connected would fail here


@pytest.mark.parametrize("verb", ["--create", "--delete"])
def test_a_dry_run_prints_the_change_and_connects_to_nothing(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "acls", "--principal", "User:alice", "--topic-prefix", "teamA", verb, "--dry-run", *NOWHERE
    )
    assert code == 0, err
    wanted = len(distinct(a for acls in acls_for(["topics"], TopicNames("teamA")).values() for a in acls))
    assert wanted == 1
    assert f"dry run: would {verb[2:]} " in out and "nothing changed" in out
    assert "ALLOW User:alice Create   topic            teamA." in out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--topic-prefix", "teamA-consumer", "--create"], "not isolated"),
        (["--topic-prefix", "teamA.x"], "not isolated"),
        (["--topic-prefix", "teamA", "--group", "teamB-processor"], "must start with 'teamA-'"),
        (["--topic-prefix", "teamA", "--dry-run"], "--dry-run goes with --create or --delete"),
    ],
)
def test_what_cannot_be_granted_safely_is_one_line_and_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "acls", "--principal", "User:carol", *argv, *NOWHERE)
    assert code == 2 and out == "", (out, err)
    assert len(err.strip().splitlines()) == 1 and said in err, err
