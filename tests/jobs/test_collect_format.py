"""``collect --format`` and ``--errors`` (processor/cli/collect.py): checked before Kafka is touched."""

from __future__ import annotations

import argparse

import pytest

from processor.cli.collect import _check_format, _errors_path


def _args(out: str, fmt: str | None = None, errors: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(out=out, format=fmt, errors=errors)


def test_the_format_must_fit_the_output_and_errors_go_with_openai_only() -> None:
    for fine in (_args("r.jsonl"), _args("r.parquet", "parquet"), _args("r.jsonl", "openai", "e.jsonl")):
        _check_format(fine)
    with pytest.raises(ValueError, match=r"--format openai writes jsonl, but --out r\.parquet is parquet"):
        _check_format(_args("r.parquet", "openai"))
    with pytest.raises(ValueError, match=r"--format jsonl writes jsonl, but --out r\.parquet"):
        _check_format(_args("r.parquet", "jsonl"))
    with pytest.raises(ValueError, match="--errors is the OpenAI error file"):
        _check_format(_args("r.jsonl", None, "e.jsonl"))
    assert _errors_path(_args("out/r.jsonl", "openai")) == "out/r.errors.jsonl"
    assert _errors_path(_args("r.jsonl", "openai", "mine.jsonl")) == "mine.jsonl"
