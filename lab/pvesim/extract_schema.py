"""Extract the part of the Proxmox VE API schema that the simulator serves, from a published copy of it.

Source: the npm package `proxmox-api` 1.1.1 (GPL-3.0, https://github.com/UrielCh/proxmox-api), whose
`src/model.ts` is generated from the Proxmox VE API description (`apidata.js` of pve-docs): every path and
method with its parameters and, for each answer, the returned type with required and optional fields.
Galaxy, GitHub and pve-docs are not reachable from this project's machines; npm is:

    npm pack proxmox-api@1.1.1 && tar xzf proxmox-api-1.1.1.tgz
    python lab/pvesim/extract_schema.py package/src/model.ts > lab/pvesim/pve-api-schema.json

The output is committed (lab/pvesim/pve-api-schema.json); tests/unit/proxmox/test_pvesim_schema.py checks every
answer and every parameter of the simulator against it.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from pvesim.server import SERVED_ENDPOINTS

METHOD_RE = re.compile(r"^\s*\* (GET|POST|PUT|DELETE) (/\S*)\s*$")
CALL_RE = re.compile(r"^\s*\$(get|post|put|delete)\((?:param\??: \{(?P<params>.*)\})?\): Promise<(?P<ret>.+)>;\s*$")
ALIAS_RE = re.compile(r"^\s*export type (\w+) = (.+);\s*$")
IFACE_RE = re.compile(r"^\s*export interface (\w+) \{\s*$")
FIELD_RE = re.compile(r"^\s*('?[\w\-\[\]]+'?)(\?)?: (.+?);?\s*$")


def base_type(t: str, aliases: dict[str, str], depth: int = 0) -> str:
    t = t.strip()
    if t.endswith("[]"):
        return base_type(t[:-2], aliases, depth) + "[]"
    if t in ("string", "number", "boolean", "any", "null"):
        return t
    if "'" in t or '"' in t:  # a union of literals: an enum of strings
        return "string"
    if t in aliases and depth < 10:
        return base_type(aliases[t], aliases, depth + 1)
    return t


def split_params(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "{(<"
        depth -= ch in "})>"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return [p.strip() for p in out if p.strip()]


def parse(model: str) -> dict:
    lines = model.splitlines()
    aliases = {m[1]: m[2] for m in map(ALIAS_RE.match, lines) if m}
    interfaces: dict[str, dict] = {}
    i = 0
    while i < len(lines):
        m = IFACE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        name, fields, additional, depth = m[1], {}, False, 1
        i += 1
        while depth > 0 and i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if depth == 1 and not stripped.startswith(("*", "/**", "*/")):
                if stripped.startswith("[additionalProperties"):
                    additional = True
                else:
                    f = FIELD_RE.match(line)
                    if f:
                        ftype = f[3]
                        ftype = "object" if ftype.startswith("{") else base_type(ftype, aliases)
                        fields[f[1].strip("'")] = {"type": ftype, "required": f[2] is None}
            depth += stripped.count("{") - stripped.count("}")
            i += 1
        interfaces[name] = {"fields": fields, "additional_properties": additional}
    endpoints: dict[str, dict] = {}
    current = None
    for line in lines:
        m = METHOD_RE.match(line)
        if m:
            current = f"{m[1]} {m[2].replace(chr(92), '')}"
            continue
        c = CALL_RE.match(line)
        if c and current and current.split()[0].lower() == c[1]:
            params = {}
            for p in split_params(c["params"] or ""):
                pm = re.match(r"^'?([\w\-\[\]]+)'?(\?)?: (.+)$", p)
                if pm:
                    params[pm[1]] = {"type": base_type(pm[3], aliases), "required": pm[2] is None}
            ret = c["ret"].strip()
            endpoints[current] = {"params": params, "returns": base_type(ret, aliases)}
            current = None
    return {"interfaces": interfaces, "endpoints": endpoints}


def main() -> int:
    src = Path(sys.argv[1])
    parsed = parse(src.read_text())
    wanted = {}
    for ep in SERVED_ENDPOINTS:
        if ep not in parsed["endpoints"]:
            raise SystemExit(f"{ep} is not in {src}")
        wanted[ep] = parsed["endpoints"][ep]
    ifaces = {}
    for ep in wanted.values():
        name = ep["returns"].removesuffix("[]")
        if name in parsed["interfaces"]:
            ifaces[name] = parsed["interfaces"][name]
    out = {
        "source": {
            "package": "npm proxmox-api 1.1.1 (src/model.ts, generated from the Proxmox VE API description)",
            "sha256_model_ts": hashlib.sha256(src.read_bytes()).hexdigest(),
            "extracted_by": "lab/pvesim/extract_schema.py",
        },
        "endpoints": wanted,
        "interfaces": ifaces,
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
