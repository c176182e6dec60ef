"""The ``openai`` engine over TLS and mutual TLS, to a real llama-server.

The server is the project's local llama-server; TLS is terminated in front of it by a small relay
in this test (the server binary is built without OpenSSL), which takes TLS connections with a
certificate from a throwaway CA (openssl) and, in mutual mode, requires a client certificate from
that CA. The engine's requests and the server's answers pass through unchanged.

Shown: with ``ca_file`` the items complete; a server whose certificate another CA signed fails the
request at once, not retried, saying which side refused; mutual TLS without ``cert_file`` is refused
by the server and with it completes; bad option combinations are one line at start.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.engines.base import make_engine
from processor.local.llm.build import build_server
from processor.local.llm.model import ensure_model
from processor.local.llm.server import ServerInfo, ServerSettings, start_server, stop_server
from tests.engines.test_openai_http import batch, item
from tests.local.test_llm_server import llm_home  # noqa: F401 (the module's fixture: a temporary home)

pytestmark = pytest.mark.llm


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}")  # fmt: skip
    return key, cert


def _issue(folder: Path, ca: tuple[Path, Path], name: str, san: str | None) -> tuple[Path, Path]:
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-out", str(csr), "-subj", f"/CN={name}")  # fmt: skip
    ext = folder / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]), "-CAcreateserial",
             "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return cert, key


class TlsRelay:
    """TLS in, plain TCP out to ``target``: one thread per connection, bytes copied both ways."""

    def __init__(
        self, target: int, cert: Path, key: Path, client_ca: Path | None = None, tls13: bool = False
    ) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        if client_ca is not None:
            self.context.load_verify_locations(client_ca)
            self.context.verify_mode = ssl.CERT_REQUIRED
            # TLS 1.2: the server refuses a missing certificate inside the handshake, so the client
            # always reads the alert. Under TLS 1.3 the client's handshake is over before the server
            # checks, and the alert races the client's request (it saw an EOF about 1 run in 4).
            if not tls13:
                self.context.maximum_version = ssl.TLSVersion.TLSv1_2
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()  # the handshake failed: the client has its alert
            return
        upstream = socket.create_connection(("127.0.0.1", self.target))
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)

    def close(self) -> None:
        self.listener.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass  # the other side closed: nothing left to copy
    finally:
        for s in (src, dst):
            s.close()


@pytest.fixture(scope="module")
def server(llm_home: Path) -> Iterator[ServerInfo]:  # noqa: F811 (the imported fixture)
    info = start_server(
        build_server().binary, ensure_model(), name="pytest-openai-tls",
        settings=ServerSettings(slots=2, ctx_tokens=1024, threads=1),
    )  # fmt: skip
    yield info
    stop_server(info.name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = _ca(folder, "ca"), _ca(folder, "other-ca")
    server_cert, server_key = _issue(folder, ca, "server", "IP:127.0.0.1")
    stranger_cert, stranger_key = _issue(folder, other, "stranger", "IP:127.0.0.1")
    client_cert, client_key = _issue(folder, ca, "consumer", None)
    return {
        "ca": ca[1], "server_cert": server_cert, "server_key": server_key, "stranger_cert": stranger_cert,
        "stranger_key": stranger_key, "client_cert": client_cert, "client_key": client_key,
    }  # fmt: skip


def _run(options: dict[str, str]) -> list[tuple[str, str, str | None]]:
    engine = make_engine("openai", {"timeout_s": "20", "retries": "3", "backoff_ms": "50", **options})
    try:
        results = engine.run(
            batch(item("a", [101, 2000, 2001, 102], 2), item("b", [101, 2000, 2002, 102], 2))
        )
    finally:
        engine.close()
    return [(r.item_id, r.status, r.reason) for r in results]


def test_tls_with_the_servers_ca_completes(server: ServerInfo, pki: dict[str, Path]) -> None:
    relay = TlsRelay(server.port, pki["server_cert"], pki["server_key"])
    try:
        done = _run({"url": f"https://127.0.0.1:{relay.port}", "ca_file": str(pki["ca"])})
    finally:
        relay.close()
    assert [(i, status) for i, status, _ in done] == [("a", "ok"), ("b", "ok")], done


def test_a_certificate_of_another_ca_fails_at_once_saying_so(
    server: ServerInfo, pki: dict[str, Path]
) -> None:
    relay = TlsRelay(server.port, pki["stranger_cert"], pki["stranger_key"])
    try:
        done = _run({"url": f"https://127.0.0.1:{relay.port}", "ca_file": str(pki["ca"])})
    finally:
        relay.close()
    for _item, status, reason in done:
        assert status == "failed"
        assert reason is not None and "the server's certificate is not trusted" in reason, reason
        assert reason.endswith("(not retried)"), reason


def test_mutual_tls_needs_the_client_certificate(server: ServerInfo, pki: dict[str, Path]) -> None:
    relay = TlsRelay(server.port, pki["server_cert"], pki["server_key"], client_ca=pki["ca"])
    url = f"https://127.0.0.1:{relay.port}"
    try:
        refused = _run({"url": url, "ca_file": str(pki["ca"])})
        mine = {"cert_file": str(pki["client_cert"]), "key_file": str(pki["client_key"])}
        done = _run({"url": url, "ca_file": str(pki["ca"]), **mine})
    finally:
        relay.close()
    assert all(status == "failed" for _, status, _ in refused), refused
    assert all("refused the TLS handshake" in (reason or "") for _, _, reason in refused), refused
    assert [(i, status) for i, status, _ in done] == [("a", "ok"), ("b", "ok")], done


def test_under_tls13_a_missing_client_certificate_is_never_retried(
    server: ServerInfo, pki: dict[str, Path]
) -> None:
    """TLS 1.3: the server's refusal races the request, which reads either the alert or an EOF
    (``SSLEOFError``); both are the refusal, failed at once and said so, never retried as a fault."""
    relay = TlsRelay(server.port, pki["server_cert"], pki["server_key"], client_ca=pki["ca"], tls13=True)
    try:
        runs = [_run({"url": f"https://127.0.0.1:{relay.port}", "ca_file": str(pki["ca"])}) for _ in range(4)]
    finally:
        relay.close()
    reasons = [reason or "" for run in runs for _, _, reason in run]
    assert all(status == "failed" for run in runs for _, status, _ in run), runs
    assert all(r.endswith("(not retried)") and "cert_file" in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"url": "http://127.0.0.1:1", "ca_file": "x.pem"}, "need an https:// url"),
        ({"url": "https://127.0.0.1:1", "cert_file": "c.pem"}, "cert_file and key_file go together"),
        ({"url": "https://127.0.0.1:1", "ca_file": "/nope/ca.pem"}, "TLS files (ca_file=/nope/ca.pem"),
    ],
)
def test_bad_tls_options_are_one_line_at_start(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=None) as refused:
        make_engine("openai", options)
    assert message in str(refused.value) and "\n" not in str(refused.value)
