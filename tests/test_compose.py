"""docker-compose.yml runs the Kafka version the local broker and CI run, so the two stacks agree;
docker-compose.secure.yml's files are readable by the users its containers run as."""

from __future__ import annotations

import fnmatch
import re

import yaml

from processor.local.jars import KAFKA_VERSION
from tests.common import ROOT


def test_compose_runs_the_local_broker_s_kafka_version() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"


def _script_files(script: str) -> tuple[dict[str, str], dict[str, tuple[int, int]]]:
    """What the secure file's ``certs`` script leaves in /certs: each file it writes -> the text it
    writes (printf), and each glob -> (group, mode) from its ``chgrp`` and ``chmod`` commands."""
    writes = {m.group(2): m.group(1) for m in re.finditer(r"printf '([^']*)'[^>\n]*> ([\w.]+)", script)}
    groups: dict[str, int] = {}
    modes: dict[str, int] = {}
    for command in re.split(r"[;\n]", script):
        words = command.split()
        if words[:1] == ["chgrp"]:
            groups.update(dict.fromkeys(words[2:], int(words[1])))
        if words[:1] == ["chmod"]:
            modes.update(dict.fromkeys(words[2:], int(words[1], 8)))
    return writes, {g: (groups.get(g, 0), mode) for g, mode in modes.items()}


def _mode_of(name: str, rules: dict[str, tuple[int, int]]) -> tuple[int, int]:
    matched = [rule for glob, rule in rules.items() if fnmatch.fnmatch(name, glob)]
    assert matched, f"/certs/{name}: no chmod covers it"
    return matched[-1]


def test_the_secure_compose_files_are_readable_by_the_users_that_read_them() -> None:
    """Each /certs file a service names (in its command, environment or healthcheck, or inside a
    settings file it reads) is readable by the user the service runs as: its ``user:``, else the
    tokenfabric image's USER (Dockerfile), else the image's own non-root user; with its ``group_add``."""
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    secure = yaml.safe_load((ROOT / "docker-compose.secure.yml").read_text(encoding="utf-8"))["services"]
    image_user = int(re.findall(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)[-1])
    assert secure["certs"]["user"] == "0"  # root writes the files: root owns them
    writes, rules = _script_files(secure["certs"]["entrypoint"][2])
    checked, unreadable = 0, []
    for name, service in secure.items():
        if name == "certs":
            continue
        merged = {**base.get(name, {}), **service}  # the secure file overrides the base file's keys
        ours = "build" in merged or str(merged.get("image", "")).startswith("tokenfabric")
        uid = int(merged["user"]) if "user" in merged else (image_user if ours else None)
        assert uid != 0, f"{name} runs as root"
        groups = {int(g) for g in service.get("group_add", [])}
        read = set(re.findall(r"/certs/([\w.]+)", yaml.safe_dump(service)))
        read |= {f for r in read for f in re.findall(r"/certs/([\w.]+)", writes.get(r, ""))}
        for file in read:
            group, mode = _mode_of(file, rules)
            checked += 1
            if not (mode & 0o004 or (group in groups and mode & 0o040)):
                unreadable.append(f"{name} (uid {uid}, groups {sorted(groups)}): /certs/{file} {mode:o}")
    assert checked >= 6
    assert not unreadable, unreadable
    # a secret is not world-readable
    for secret in ("store.password", "kafka.p12", "admin.p12", "admin.properties"):
        assert not _mode_of(secret, rules)[1] & 0o004, secret
