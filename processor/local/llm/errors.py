"""The one error of the local generation server: foreseeable failures the CLI prints as one line."""

from __future__ import annotations


class LlmLocalError(RuntimeError):
    """llama-server could not be built, its model written, or the server started or stopped."""
