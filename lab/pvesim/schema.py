"""The Proxmox VE API schema of one release (schema/pve-<release>.json) and PVE's own checks against it.

Parameters are verified as PVE::JSONSchema validate/check_prop does (pve-common 5054082 src/PVE/JSONSchema.pm,
"PC" below): type (check_type, PC:1176-1292), format (check_format PC:975-1017, property strings
parse_property_string PC:1068-1149), pattern, maxLength/minLength, minimum/maximum, enum (check_prop
PC:1507-1692), unknown and missing properties (check_object PC:1297-1387), with PVE's messages; the errors go
into HTTP 400 {"data": null, "errors": {param: msg}, "message": "Parameter verification failed.\\n"}
(pve-common src/PVE/Exception.pm:78-96 raise_param_exc; pve-manager PVE/HTTPServer.pm:221-230;
pve-http-server src/PVE/APIServer/Formatter/Standard.pm:14-39).

Answers are checked against the method's `returns` schema (tests): required fields, types, and no field the
schema does not list unless it allows additional properties (an object schema without `properties` describes
nothing and allows any field).
"""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

from pvesim.formats import SUBKEYS, VALIDATORS, FormatError, NotSimulated, check_named

SCHEMA_DIR = Path(__file__).with_name("schema")
RELEASES = ("8.4", "9.1")
INDEXED_RE = re.compile(r"^([a-z]+)\[n\]$")
# Fields Proxmox VE returns that its return schema does not list (consumers use them: the proxmox inventory plugin
# reads a node's `type`); the answer check accepts exactly these beyond the schema.
UNDOCUMENTED_FIELDS = {
    # pve-manager 14a22df3 PVE/API2/Nodes.pm:2987 -> PVE/API2Tools.pm:41-67 extract_node_stats
    "GET /nodes": {"id": "string", "type": "string", "disk": "integer", "maxdisk": "integer"},
    # qemu-server 41ffc59e src/PVE/API2/Qemu.pm:6129-6135 (8.4.10: 5909-5915), the entry 'current'
    "GET /nodes/{node}/qemu/{vmid}/snapshot": {"digest": "string", "running": "integer"},
}


def release_of(version: str) -> str:
    """The schema release for a PVE version string ('8.4.1' -> '8.4'; any 9.x -> '9.1')."""
    major = version.split(".")[0]
    for rel in RELEASES:
        if rel.split(".")[0] == major:
            return rel
    raise ValueError(f"pvesim has no schema for Proxmox VE {version} (has {', '.join(RELEASES)})")


class PropertyStringError(Exception):
    """PC:1144 raise "format error\\n", errors => {...}; stringified by PVE::Exception (Exception.pm:98-116)."""

    def __init__(self, errors: dict):
        super().__init__("format error\n" + "".join(f"{k}: {v}\n" for k, v in sorted(errors.items())))


def perl_re(pattern: str) -> str:
    """A Perl pattern as apidata.js prints it ('(?^:...)', '(?^i:...)') in Python syntax."""
    return re.sub(r"\(\?\^([a-z]*):", lambda m: f"(?{m[1]}:" if m[1] else "(?:", pattern)


# The length and range limits of a scalar, in the order PVE checks them (the range only of a value that is a number):
# (schema key, what is measured, the comparison that fails, the message with the limit)
BOUNDS = (
    ("maxLength", len, operator.gt, "value may only be {} characters long"),
    ("minLength", len, operator.lt, "value must be at least {} characters long"),
    ("maximum", float, operator.gt, "value must have a maximum value of {}"),
    ("minimum", float, operator.lt, "value must have a minimum value of {}"),
)


def is_number(v: str) -> bool:  # PC:1163-1168
    return bool(re.fullmatch(r"[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?", v))


def parse_boolean(v: str):  # PC:1061-1066
    if re.fullmatch(r"(?i:1|on|yes|true)", v):
        return 1
    if re.fullmatch(r"(?i:0|off|no|false)", v):
        return 0
    return None


def expand_indexed(props: dict, index_max: dict) -> dict:
    """name[n] -> name0..name<count-1> (the counts of qemu-server, see extract_schema.py INDEX_MAX)."""
    out = {}
    for name, spec in props.items():
        m = INDEXED_RE.match(name)
        if m:
            out.update({f"{m[1]}{i}": spec for i in range(index_max[m[1]]["count"])})
        else:
            out[name] = spec
    return out


class Schema:
    def __init__(self, release: str):
        self.release = release
        self.data = json.loads((SCHEMA_DIR / f"pve-{release}.json").read_text())
        self.index_max = self.data["index_max"]

    def endpoint(self, endpoint: str) -> dict:
        return self.data["endpoints"][endpoint]

    def param_props(self, endpoint: str) -> dict:
        return expand_indexed(self.endpoint(endpoint)["parameters"].get("properties", {}), self.index_max)

    def answer_props(self, endpoint: str) -> dict:
        return expand_indexed(self.endpoint(endpoint)["returns"].get("properties", {}), self.index_max)

    # ---- parameters ---------------------------------------------------------------------------
    def param_errors(self, endpoint: str, params: dict) -> dict:
        """PVE's parameter verification of one request: {param: message}, empty when it passes."""
        errors: dict = {}
        props = self.param_props(endpoint)
        for name, spec in props.items():
            self.check_prop(params.get(name), spec, name, errors)
        for name in params:
            if name not in props:
                errors[name] = "property is not defined in schema and the schema does not allow additional properties"
        return errors

    def check_prop(self, value, spec: dict, path: str, errors: dict) -> None:
        if "alias" in spec:
            return
        if value is None:
            if not spec.get("optional"):
                errors[path] = "property is missing and it is not optional"
            return
        problem = self._type_problem(value, spec.get("type", "string"))
        if problem:
            errors[path] = problem
            return
        value = str(int(value)) if isinstance(value, bool) else str(value)
        if "format" in spec:
            try:
                self.check_format(spec, value, path)
            except (FormatError, PropertyStringError) as e:
                errors[path] = f"invalid format - {e}"
                return
        if "pattern" in spec and not re.fullmatch(perl_re(spec["pattern"]).removeprefix("^").removesuffix("$"), value):
            errors[path] = "value does not match the regex pattern"
            return
        for key, measure, beyond, message in BOUNDS:
            if key in spec and (measure is len or is_number(value)) and beyond(measure(value), spec[key]):
                errors[path] = message.format(spec[key])
                return
        if "enum" in spec and value not in spec["enum"]:
            errors[path] = f"value '{value}' does not have a value in the enumeration '{', '.join(spec['enum'])}'"

    @staticmethod
    def _type_problem(value, typ: str) -> str | None:
        """PC:1176-1292 check_type for a scalar parameter (form values are strings; JSON bodies may be typed)."""
        if isinstance(value, (dict, list)):
            return f"type check ('{typ}') failed - got {'HASH' if isinstance(value, dict) else 'ARRAY'}"
        if isinstance(value, bool):
            ok = typ in ("boolean", "string", "any")
            return None if ok else f"type check ('{typ}') failed - got JSON::PP::Boolean"
        v = str(value)
        if typ == "boolean" and v not in ("0", "1"):
            return f"type check ('boolean') failed - got '{v}'"
        if typ == "integer" and not re.fullmatch(r"[+-]?\d+", v):
            return f"type check ('integer') failed - got '{v}'"
        if typ == "number" and not is_number(v):
            return f"type check ('number') failed - got '{v}'"
        return None

    def check_format(self, spec: dict, value: str, path: str) -> None:
        fmt = spec["format"]
        if isinstance(fmt, dict):
            self.parse_property_string(fmt, value, path, None)
        elif "typetext_format" in spec:
            keys = {}
            for k, sub in spec["typetext_format"].items():  # typetext's keys + what formats.py knows of them
                extra = SUBKEYS.get((fmt, k))
                keys[k] = {**{x: y for x, y in sub.items() if x != "typetext"}, **extra} if extra else sub
            parsed = self.parse_property_string(keys, value, path, fmt)
            if fmt in VALIDATORS:
                VALIDATORS[fmt](parsed)
        else:
            check_named(fmt, value)

    def parse_property_string(self, fmt: dict, data: str, path: str, name: str | None) -> dict:
        """PC:1068-1149 parse_property_string (additional properties not allowed)."""
        res: dict = {}
        default_key = None
        for part in data.split(","):
            if not part.strip():
                continue
            m = re.fullmatch(r"([^=]+)=(.+)", part, re.S)
            if m:
                k, v = m[1], m[2]
                if k in res:
                    raise FormatError(f"duplicate key in comma-separated list property: {k}\n")
                sub = fmt.get(k)
                if sub and "alias" in sub:
                    k, sub = sub["alias"], fmt.get(sub["alias"])
                    if k in res:
                        raise FormatError(f"key '{k}' is already defined (via alias)\n")
                if not sub:
                    raise FormatError(f"invalid key in comma-separated list property: {k}\n")
                if sub.get("type") == "boolean":
                    b = parse_boolean(v)
                    v = v if b is None else str(b)
                res[k] = v
            elif "=" not in part:
                if default_key:
                    raise FormatError(f"duplicate key in comma-separated list property: {default_key}\n")
                default_key = next((k for k, s in fmt.items() if s.get("default_key")), None)
                if default_key is None:
                    raise FormatError("value without key, but schema does not define a default key\n")
                if default_key in res:
                    raise FormatError(f"duplicate key in comma-separated list property: {default_key}\n")
                if fmt[default_key].get("type") == "boolean":
                    b = parse_boolean(part)
                    part = part if b is None else str(b)
                res[default_key] = part
            else:
                raise FormatError("missing key in comma-separated list property\n")
        errors: dict = {}
        for k, sub in fmt.items():
            if "typetext" in sub and k in res:
                raise NotSimulated(f"the value check of {name}.{k} ({sub['typetext']})")
            self.check_prop(res.get(k), sub, f"{path}.{k}", errors)
        if errors:
            raise PropertyStringError(errors)
        return res

    # ---- answers ------------------------------------------------------------------------------
    def answer_problems(self, endpoint: str, data) -> list[str]:
        """Problems of one answer against the method's return schema."""
        spec = self.endpoint(endpoint)["returns"]
        extra = {k: {"type": t, "optional": 1} for k, t in UNDOCUMENTED_FIELDS.get(endpoint, {}).items()}
        if extra:
            item = spec.get("items", spec)
            item = {**item, "properties": {**item.get("properties", {}), **extra}}
            spec = {**spec, "items": item} if "items" in spec else item
        return [f"{endpoint}: {p}" for p in self._answer(data, spec, "data")]

    def _answer(self, value, spec: dict, path: str) -> list[str]:
        typ = spec.get("type", "any")
        if value is None:
            return [] if spec.get("optional") or typ in ("null", "any") else [f"{path} is null"]
        checks = {
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": lambda v: v in (0, 1) or isinstance(v, bool),
            "array": lambda v: isinstance(v, list),
            "object": lambda v: isinstance(v, dict),
        }
        types = typ if isinstance(typ, list) else [typ]
        if not any(t not in checks or checks[t](value) for t in types):
            return [f"{path}={value!r} is not {typ}"]
        problems = []
        if isinstance(value, list) and "items" in spec:
            for i, item in enumerate(value):
                problems += self._answer(item, spec["items"], f"{path}[{i}]")
        if isinstance(value, dict) and "properties" in spec:
            props = expand_indexed(spec["properties"], self.index_max)
            for name, sub in props.items():
                if name not in value and not sub.get("optional") and not INDEXED_RE.match(name):
                    problems.append(f"{path}.{name} missing")
            for name, v in value.items():
                if name in props:
                    problems += self._answer(v, props[name], f"{path}.{name}")
                elif not spec.get("additionalProperties"):
                    problems.append(f"{path}.{name} is not in the schema (unknown field)")
        return problems
