"""What tests in every folder share: the repository root, and a GET that reports HTTP errors as codes."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (schemas/, docs/, data/, benchmarks/, k8s/ live here)."""


def get(url: str, timeout_s: float = 10.0) -> tuple[int, str]:
    """``(status, body)`` of a GET; an HTTP error is its status and body, a server not listening
    (yet) is status 0 and the reason."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)
