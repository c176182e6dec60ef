"""A throwaway certificate authority and the certificates it signs, made with the JDK's ``keytool``.

Why keytool: the local broker already needs Java 17, and keytool ships with every JDK, so a secured
broker needs nothing the default one does not (the ``cryptography`` package is not a dependency, and
``openssl`` is not on every machine). Each keytool start costs a JVM start; the flags of ``_KEYTOOL``
(C1 only, the serial collector) halve it, and one identity takes five calls (about 3 s here).

Every key store is PKCS#12 with one random password (per store): the broker reads PKCS#12,
and librdkafka does too (``ssl.keystore.location`` / ``ssl.keystore.password``), so a client's
certificate and key never need converting to PEM. The CA's certificate is written as PEM
(``ca.pem``): the broker's trust store (``ssl.truststore.type=PEM``) and librdkafka's
``ssl.ca.location``. The CA's own key store, which holds its private key, never leaves ``directory``.

Invariant: an identity's certificate names it as ``CN=<name>`` and nothing else, so the broker's
``ssl.principal.mapping.rules`` (:data:`PRINCIPAL_RULE`) maps it to the principal ``User:<name>``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from processor.local.jars import KafkaLocalError, tail_text

#: ``CN=alice`` -> ``alice``: the principal of a client certificate is its common name.
PRINCIPAL_RULE = "RULE:^CN=([^,]+)$/$1/,DEFAULT"

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

_KEYTOOL_JVM = ("-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC")


@dataclass(frozen=True)
class Authority:
    """A CA made for one broker start: its PEM certificate and the key store that signs with it."""

    directory: Path
    cert_pem: Path
    store: Path
    password: str = field(repr=False)


@dataclass(frozen=True)
class Identity:
    """One certificate and its key in a PKCS#12 store (``CN=<name>``), signed by an :class:`Authority`."""

    name: str
    store: Path
    password: str = field(repr=False)


def check_name(name: str, what: str = "name") -> str:
    """Names go into a DN, a file name and a principal: 1-64 of A-Z a-z 0-9 . _ -."""
    if not _NAME.match(name):
        raise KafkaLocalError(f"{what} {name!r}: use 1-64 of A-Z a-z 0-9 . _ -")
    return name


def make_authority(directory: Path, name: str = "tokenfabric-local-ca", validity_days: int = 30) -> Authority:
    """A self-signed CA in ``directory`` (created): ``<name>.p12`` (its key) and ``<name>.pem``."""
    directory.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(16)
    store, pem = directory / f"{name}.p12", directory / f"{name}.pem"
    _keytool(
        "-genkeypair", "-alias", "ca", *_KEY, "-dname", f"CN={check_name(name)}", "-ext", "bc:c",
        "-validity", str(validity_days), *_store(store), password=password,
    )  # fmt: skip
    _keytool("-exportcert", "-rfc", "-alias", "ca", *_store(store), "-file", str(pem), password=password)
    store.chmod(0o600)
    return Authority(directory, pem, store, password)


def issue(
    authority: Authority,
    name: str,
    *,
    validity_days: int = 30,
    start: str | None = None,
    server_ip: str | None = None,
) -> Identity:
    """A key pair for ``CN=<name>`` signed by ``authority``, in ``<directory>/<name>.p12``.

    ``start`` is keytool's ``-startdate`` (``-2d``: two days ago; with ``validity_days`` 1 the
    certificate expired yesterday). ``server_ip`` adds the address as a subject alternative name,
    which clients check the broker's certificate against (``ssl.endpoint.identification.algorithm``).
    """
    store = authority.directory / f"{check_name(name)}.p12"
    csr, crt = store.with_suffix(".csr"), store.with_suffix(".crt")
    password = secrets.token_hex(16)
    own = _store(store)
    _keytool(
        "-genkeypair", "-alias", "me", *_KEY, "-dname", f"CN={name}", "-validity", "1", *own,
        password=password,
    )  # fmt: skip
    _keytool("-certreq", "-alias", "me", *own, "-file", str(csr), password=password)
    extensions = ["-ext", "KU=digitalSignature,keyEncipherment", "-ext", "EKU=serverAuth,clientAuth"]
    if server_ip is not None:
        extensions += ["-ext", f"SAN=ip:{server_ip},dns:localhost"]
    dates = ["-startdate", start] if start is not None else []
    _keytool(
        "-gencert", "-alias", "ca", *_store(authority.store), "-infile", str(csr),
        "-outfile", str(crt), "-rfc", "-validity", str(validity_days), *dates, *extensions,
        password=authority.password,
    )  # fmt: skip
    # the reply is installed only over a chain keytool can build: the CA first, as a trusted entry
    _keytool(
        "-importcert", "-noprompt", "-alias", "ca", "-file", str(authority.cert_pem), *own, password=password
    )
    _keytool("-importcert", "-alias", "me", "-file", str(crt), *own, password=password)
    csr.unlink()
    store.chmod(0o600)
    return Identity(name, store, password)


_KEY = ("-keyalg", "EC", "-groupname", "secp256r1")


_PASSWORD_ENV = "TOKENFABRIC_KEYTOOL_PASSWORD"


def _store(path: Path) -> list[str]:
    """One key store per keytool call; its password comes from the environment, never argv (ps)."""
    env = _PASSWORD_ENV
    return ["-keystore", str(path), "-storetype", "PKCS12", "-storepass:env", env, "-keypass:env", env]


def _keytool(*args: str, password: str) -> None:
    keytool = shutil.which("keytool")
    if keytool is None:
        raise KafkaLocalError("keytool is not on PATH: a secured broker needs the JDK's keytool")
    proc = subprocess.run(
        [keytool, *_KEYTOOL_JVM, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, _PASSWORD_ENV: password},
    )
    if proc.returncode != 0:
        raise KafkaLocalError(
            f"keytool {args[0]} failed (exit {proc.returncode}): {tail_text(proc.stdout + proc.stderr, 5)}"
        )
