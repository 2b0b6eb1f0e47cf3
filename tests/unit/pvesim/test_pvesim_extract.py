"""extract_schema.py: the typetext parser, the provenance of the committed schema files, and (with the pve-docs and
qemu-server git mirrors at hand) that extracting again gives the committed files byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pvesim.extract_schema import VERSIONS, typetext_format
from pvesim.schema import SCHEMA_DIR

HOSTPCI_91 = (
    "[[host=]<HOSTPCIID[;HOSTPCIID2...]>] [,device-id=<hex id>] [,driver=<vfio|keep>] [,legacy-igd=<1|0>] "
    "[,mapping=<mapping-id>] [,mdev=<string>] [,pcie=<1|0>] [,rombar=<1|0>] [,romfile=<string>] "
    "[,sub-device-id=<hex id>] [,sub-vendor-id=<hex id>] [,vendor-id=<hex id>] [,x-vga=<1|0>]"
)


def test_typetext_gives_keys_types_enums_and_the_default_key():
    fmt = typetext_format(HOSTPCI_91)
    assert fmt["host"] == {"default_key": 1, "optional": 1, "type": "string", "typetext": "<HOSTPCIID[;HOSTPCIID2...]>"}
    assert fmt["pcie"] == {"optional": 1, "type": "boolean"}
    assert fmt["driver"] == {"optional": 1, "type": "string", "enum": ["vfio", "keep"]}
    assert fmt["device-id"]["typetext"] == "<hex id>"  # a constraint typetext does not carry: formats.py adds it
    assert typetext_format("cpus=<id[-id];...> [,policy=<preferred|bind|interleave>]")["cpus"] == {
        "type": "string",
        "typetext": "<id[-id];...>",
    }
    assert typetext_format("<string>") is None  # not a property string
    assert typetext_format("[,phys-bits=<8-64|host>]")["phys-bits"]["typetext"] == "<8-64|host>"  # a range, no enum


@pytest.mark.parametrize("release", sorted(VERSIONS))
def test_committed_schema_names_its_source(release):
    data = json.loads((SCHEMA_DIR / f"pve-{release}.json").read_text())
    src = data["source"]["pve-docs"]
    assert src["commit"] == VERSIONS[release]["pve-docs"][0] and len(src["sha256"]) == 64
    assert data["index_max"]["hostpci"]["count"] == 16 and data["index_max"]["numa"]["count"] == 8
    hostpci = data["endpoints"]["PUT /nodes/{node}/qemu/{vmid}/config"]["parameters"]["properties"]["hostpci[n]"]
    assert ("driver" in hostpci["typetext_format"]) == (release != "8.4")


@pytest.mark.skipif(
    not (os.environ.get("PVESIM_PVE_DOCS_GIT") and os.environ.get("PVESIM_QEMU_SERVER_GIT")),
    reason="needs git mirrors of pve-docs and qemu-server (PVESIM_PVE_DOCS_GIT, PVESIM_QEMU_SERVER_GIT)",
)
def test_extracting_again_gives_the_committed_files(tmp_path):
    script = Path(__file__).resolve().parents[3] / "lab" / "pvesim" / "extract_schema.py"
    subprocess.run(
        [sys.executable, str(script), "--pve-docs", os.environ["PVESIM_PVE_DOCS_GIT"]]
        + ["--qemu-server", os.environ["PVESIM_QEMU_SERVER_GIT"], "--out", str(tmp_path)],
        check=True,
    )
    for release in VERSIONS:
        assert (tmp_path / f"pve-{release}.json").read_bytes() == (SCHEMA_DIR / f"pve-{release}.json").read_bytes()
