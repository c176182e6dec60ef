"""TLS for an engine's HTTP server: which CA to trust, which client certificate to present.

A generation server on a shared cluster sits behind TLS, often with its own CA and, in a zero-trust
mesh, mutual TLS. The files are checked when the engine is built (the consumer then exits 2 with one
line for a missing or unreadable one) rather than at the first batch. At run time a certificate
refused either way is not a condition a retry cures: :func:`tls_refusal` names it, and the engine
fails the request at once instead of retrying it until its deadline.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: ``ca_file`` the CAs to trust (None: the system's), ``cert_file`` and ``key_file``
    the client certificate and its key for mutual TLS (both or neither)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                "openai engine: cert_file and key_file go together (a client certificate and its key)"
            )

    @property
    def given(self) -> bool:
        return any((self.ca_file, self.cert_file, self.key_file))


def tls_context(files: TlsFiles) -> ssl.SSLContext:
    """A client context that verifies the server (against ``ca_file``, else the system's CAs) and,
    with a client certificate, presents it. ValueError with one line for a file it cannot use."""
    try:
        context = ssl.create_default_context(cafile=files.ca_file)
        if files.cert_file is not None:
            context.load_cert_chain(files.cert_file, files.key_file)
    except (OSError, ssl.SSLError) as exc:
        which = f"ca_file={files.ca_file}, cert_file={files.cert_file}, key_file={files.key_file}"
        raise ValueError(f"openai engine: TLS files ({which}) unusable: {exc}") from None
    return context


def tls_refusal(exc: BaseException, presented_cert: bool = True) -> str | None:
    """What was refused, when ``exc`` is a TLS handshake that no retry will pass: this side did not
    trust the server's certificate, or the server refused ours (or wanted one); else None.

    ``presented_cert``: whether this client has a certificate to present. Under TLS 1.3 the client's
    handshake ends before the server checks the client's certificate, so a server that wants one and
    got none may just close the connection: the request then reads an EOF (``SSLEOFError``) instead
    of the alert. Without a certificate of ours that EOF is the refusal, not a passing fault.
    """
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the server's certificate is not trusted ({exc.verify_message}; check ca_file)"
    if isinstance(exc, ssl.SSLError) and "ALERT" in (exc.reason or ""):
        return f"the server refused the TLS handshake ({exc.reason}; check cert_file and key_file)"
    if isinstance(exc, ssl.SSLEOFError) and not presented_cert:
        return (
            "the server closed the TLS connection unanswered: it wants a client certificate (set "
            "cert_file and key_file)"
        )
    return None
