"""``tokenfabric share-queue``: one card of the share-group queue baseline (processor.apps.sharequeue).

A baseline for ``tokenfabric demo``, not a way to run tokenfabric: the cards join one Kafka share
group (KIP-932) on the ingest topic, pack each poll's records in arrival order under their contract
and acknowledge them after writing the completions (at-least-once: share consumers cannot join a
transaction). Flags and exit statuses as ``tokenfabric plain-queue``.
"""

from __future__ import annotations

import argparse

from processor.cli.plainqueue import configure as configure_card
from processor.cli.plainqueue import run_card

PROG = "tokenfabric share-queue"


def configure(p: argparse.ArgumentParser) -> None:
    configure_card(p)


def run(args: argparse.Namespace) -> int:
    from processor.apps.sharequeue import ShareQueueApp

    return run_card(args, PROG, ShareQueueApp)
