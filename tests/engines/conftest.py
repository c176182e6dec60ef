"""Fixtures of the engine tests: ``server``, a stand-in ``/v1/completions`` server (fake_completions.py)."""

from tests.engines.fake_completions import server

__all__ = ["server"]
