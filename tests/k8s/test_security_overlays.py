"""k8s/security's overlays, rendered as a user renders them (an overlay of their own including the
Component: k8s/security/README.md): every pod that reads the client settings mounts the files those
settings name, and the Secret it mounts holds them.

The collector's pod once had settings pointing at ``/etc/tokenfabric-tls/ca.crt`` and no mount.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.common import ROOT

OVERLAYS = ("scram", "mtls")
#: What each Secret holds (k8s/security/README.md).
SECRET_KEYS = {
    "tokenfabric-kafka-ca": {"ca.crt"},
    "tokenfabric-kafka-tls": {"ca.crt", "tls.crt", "tls.key"},
}

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


def _render(overlay: str, folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of an overlay outside k8s/ that includes the Component ``overlay``."""
    k8s = os.path.relpath(ROOT / "k8s", folder)  # kustomize takes relative paths only
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{k8s}]\ncomponents: [{k8s}/security/{overlay}]\n"
    )
    out = subprocess.run(
        ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(folder)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _settings_files(docs: list[dict[str, Any]]) -> set[str]:
    """The paths the ``tokenfabric-kafka`` ConfigMap's ``ssl.*.location`` settings name."""
    config = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "tokenfabric-kafka"
    )
    lines = config["data"]["kafka.properties"].splitlines()
    return {
        v for k, _, v in (line.partition("=") for line in lines) if k.startswith("ssl.") and "location" in k
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_that_reads_the_settings_mounts_the_files_they_name(overlay: str, tmp_path: Path) -> None:
    docs = _render(overlay, tmp_path)
    wanted = _settings_files(docs)
    assert wanted, "the overlay's settings name no TLS file"
    checked, wrong = [], {}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            if "--kafka-config" not in c.get("args", []):
                continue
            checked.append(f"{doc['metadata']['name']}/{c['name']}")
            there: set[str] = set()
            for mount in c.get("volumeMounts", []):
                secret = volumes.get(mount["name"], {}).get("secret")
                if secret is not None:
                    keys = SECRET_KEYS.get(secret["secretName"], set())
                    there |= {f"{mount['mountPath']}/{k}" for k in keys}
            if not wanted <= there:
                wrong[checked[-1]] = sorted(wanted - there)
    assert {"tokenfabric-collector/collector", "tokenfabric-processor/processor"} <= set(checked), checked
    assert not wrong, wrong
