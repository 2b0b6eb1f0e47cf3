"""Extract the part of the Proxmox VE API schema that pvesim serves, from Proxmox VE's own API description.

Source: `api-viewer/apidata.js` of pve-docs (github.com/proxmox/pve-docs, AGPL-3.0-or-later), the dump of every
API method's parameter and return schema that pve-docs generates from a running PVE (PVE::RESTHandler
api_dump); one file per supported release, from pinned commits (VERSIONS). apidata.js folds indexed options
into one `name[n]` key (pve-common src/PVE/RESTHandler.pm:81-89, "convert indexed parameters like -net\\d+ to
-net[n]"), so how many there are is read from qemu-server's sources at the matching commit (INDEX_MAX).
Options whose format is a registered *named* property-string format (e.g. hostpci: `pve-qm-hostpci`) carry only
the format's name and its `typetext`; the typetext lists every key with its type (`<1|0>` boolean, `<a|b>` enum,
`<integer>`, `<number>`) and is parsed here into `typetext_format` (keys, types, small enums, the default key).
Constraints typetext does not carry (patterns, large enums) are added by pvesim/formats.py, citing the source.

    python lab/pvesim/extract_schema.py --pve-docs <git dir of pve-docs> --qemu-server <git dir of qemu-server>

writes lab/pvesim/schema/pve-<release>.json (committed). Descriptions are dropped (size); everything that
validates is kept: type, format, enum, pattern, minimum/maximum, minLength/maxLength, optional, default_key,
alias, requires, additionalProperties, and for answers the properties and items.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Releases: pve-docs commit of the release's apidata.js, qemu-server commit of the same release line.
VERSIONS = {
    "8.4": {
        "pve-docs": ("fa0b4f6ba0eb7c6a77dec8cb6713bb3bbcd83ebc", "stable-bookworm, 'bump version to 8.4.2'"),
        "qemu-server": ("5ccd363e", "stable-bookworm, 'bump version to 8.4.10'"),
    },
    "9.1": {
        "pve-docs": ("e5010dcea566a205770572cfbc5fe0af220d5077", "master, 'bump version to 9.1.3'"),
        "qemu-server": ("41ffc59e", "master, 'bump version to 9.1.19'"),
    },
}

# name[n] -> (file in qemu-server, Perl variable holding how many there are)
INDEX_MAX = {
    "hostpci": ("src/PVE/QemuServer/PCI.pm", "MAX_HOSTPCI_DEVICES"),
    "numa": ("src/PVE/QemuServer/Memory.pm", "MAX_NUMA"),
    "net": ("src/PVE/QemuServer.pm", "MAX_NETS"),
    "ipconfig": ("src/PVE/QemuServer.pm", "MAX_NETS"),  # QemuServer.pm: ipconfig$i for $i < $MAX_NETS
    "serial": ("src/PVE/QemuServer.pm", "MAX_SERIAL_PORTS"),
    "parallel": ("src/PVE/QemuServer.pm", "MAX_PARALLEL_PORTS"),
    "usb": ("src/PVE/QemuServer/USB.pm", "MAX_USB_DEVICES"),
    "virtiofs": ("src/PVE/QemuServer/Virtiofs.pm", "MAX_VIRTIOFS"),
    "ide": ("src/PVE/QemuServer/Drive.pm", "MAX_IDE_DISKS"),
    "scsi": ("src/PVE/QemuServer/Drive.pm", "MAX_SCSI_DISKS"),
    "virtio": ("src/PVE/QemuServer/Drive.pm", "MAX_VIRTIO_DISKS"),
    "sata": ("src/PVE/QemuServer/Drive.pm", "MAX_SATA_DISKS"),
    "unused": ("src/PVE/QemuServer/Drive.pm", "MAX_UNUSED_DISKS"),
}

KEEP = {
    "type",
    "format",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "optional",
    "default_key",
    "alias",
    "keyAlias",
    "requires",
    "additionalProperties",
    "properties",
    "items",
    "default",
}
TYPETEXT_ITEM_RE = re.compile(r"(?P<open>\[?)(?:\[(?P<dk>[\w-]+)=\]|,?(?P<key>[\w-]+)=)(?P<type><[^>]*>)(?P<close>\]?)")


def git_show(gitdir: Path, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(gitdir), "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def load_apidata(text: str) -> dict[str, dict]:
    """apidata.js is `const apiSchema = [...];`: index every method as 'METHOD /path'."""
    tree = json.loads(text[text.index("[") : text.rindex("]") + 1])
    index: dict[str, dict] = {}

    def walk(node: dict) -> None:
        for method, info in node.get("info", {}).items():
            index[f"{method} {node['path']}"] = info
        for child in node.get("children", []):
            walk(child)

    for node in tree:
        walk(node)
    return index


def typetext_format(typetext: str) -> dict | None:
    """Keys of a property string from its typetext (pve-common src/PVE/JSONSchema.pm generate_typetext)."""
    out = {}
    for m in TYPETEXT_ITEM_RE.finditer(typetext):
        key, text = m["dk"] or m["key"], m["type"][1:-1]
        spec: dict = {"optional": 1} if m["open"] else {}
        if m["dk"]:
            spec["default_key"] = 1
        if text == "1|0":
            spec["type"] = "boolean"
        elif text in ("integer", "number"):
            spec["type"] = text
        elif re.fullmatch(r"[A-Za-z0-9_.+-]+(\|[A-Za-z0-9_.+-]+)+", text) and not re.search(r"\d-\d", text):
            spec.update(type="string", enum=text.split("|"))
        else:  # <string>, <enum> (more than three values) or a format_description: constraints not carried
            spec.update(type="string", typetext=f"<{text}>")
        out[key] = spec
    if not out or TYPETEXT_ITEM_RE.sub("", typetext).strip():
        return None
    return out


def prune(schema):
    if isinstance(schema, list):
        return [prune(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "properties" or k == "format" and isinstance(v, dict):
            out[k] = {name: prune(sub) for name, sub in v.items()}
        elif k in KEEP:
            out[k] = prune(v)
    if isinstance(schema.get("format"), str) and "typetext" in schema:
        parsed = typetext_format(schema["typetext"])
        if parsed:
            out["typetext_format"] = parsed
    return out


def index_max(gitdir: Path, commit: str) -> dict:
    out = {}
    for prefix, (path, var) in INDEX_MAX.items():
        text = git_show(gitdir, commit, path)
        for lineno, line in enumerate(text.splitlines(), 1):
            m = re.match(rf"^(?:our|my) \${var} = (\d+);", line)
            if m:
                out[prefix] = {"count": int(m[1]), "source": f"qemu-server {commit} {path}:{lineno} ${var}"}
                break
        else:
            raise SystemExit(f"${var} not found in qemu-server {commit}:{path}")
    return out


def extract(release: str, pve_docs: Path, qemu_server: Path, endpoints: list[str]) -> dict:
    docs_commit, docs_ref = VERSIONS[release]["pve-docs"]
    qs_commit, qs_ref = VERSIONS[release]["qemu-server"]
    text = git_show(pve_docs, docs_commit, "api-viewer/apidata.js")
    api = load_apidata(text)
    out_eps = {}
    for ep in endpoints:
        if ep not in api:
            raise SystemExit(f"{ep} is not in apidata.js of pve-docs {docs_commit}")
        info = api[ep]
        out_eps[ep] = {
            "allowtoken": info.get("allowtoken", 0),
            "permissions": info.get("permissions", {}),
            "parameters": prune(info.get("parameters", {})),
            "returns": prune(info.get("returns", {})),
        }
    return {
        "release": release,
        "source": {
            "pve-docs": {
                "repository": "https://github.com/proxmox/pve-docs (AGPL-3.0-or-later)",
                "commit": docs_commit,
                "ref": docs_ref,
                "path": "api-viewer/apidata.js",
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
            },
            "qemu-server": {"repository": "https://github.com/proxmox/qemu-server", "commit": qs_commit, "ref": qs_ref},
            "extracted_by": "lab/pvesim/extract_schema.py",
        },
        "index_max": index_max(qemu_server, qs_commit),
        "endpoints": out_eps,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pve-docs", type=Path, required=True, help="git directory of github.com/proxmox/pve-docs")
    ap.add_argument("--qemu-server", type=Path, required=True, help="git directory of github.com/proxmox/qemu-server")
    ap.add_argument("--out", type=Path, default=HERE / "schema")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent))  # run as a script: lab/ holds the pvesim package
    from pvesim.endpoints import SCHEMA_ENDPOINTS

    args.out.mkdir(exist_ok=True)
    for release in VERSIONS:
        data = extract(release, args.pve_docs, args.qemu_server, SCHEMA_ENDPOINTS)
        (args.out / f"pve-{release}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
