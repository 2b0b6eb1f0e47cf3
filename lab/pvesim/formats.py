"""Named formats of the Proxmox VE API schema that apidata.js names but does not spell out.

apidata.js gives a parameter's format only by name when the format is registered (PVE::JSONSchema::register_format):
plain verifiers (`dns-name`, `pve-tag-list`, ...) and named property strings (`pve-qm-hostpci`, ...; their keys come
from the typetext, see extract_schema.py). The verifiers and the constraints typetext does not carry are written
here after their source; each raises FormatError with the message PVE dies with.

Sources (line numbers at these commits):
  pve-common 5054082 (9.1.21) src/PVE/JSONSchema.pm   = PC
  qemu-server 41ffc59e (9.1.19) src/PVE/...           = QS
A format or key not listed here is NOT simulated: a request using it is refused with NotSimulated (HTTP 501),
never silently accepted.
"""

from __future__ import annotations

import ipaddress
import re


class FormatError(Exception):
    """The message PVE's format verifier dies with (ends with a newline, as Perl's die "...\\n")."""


class NotSimulated(Exception):
    """A format pvesim does not check: refused instead of accepted."""


CONFIGID_RE = r"[a-z][a-z0-9_-]+"  # PC:30 $CONFIGID_RE (case-insensitive)
PVE_TAG_RE = r"[a-z0-9_][a-z0-9_\-\+\.]*"  # PC:890 $PVE_TAG_RE (case-insensitive)
PCIRE = r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"  # QS QemuServer/PCI.pm:28 $PCIRE


def split_list(text: str) -> list[str]:
    """pve-common src/PVE/ParseUtils.pm:49-58 split_list: commas and semicolons are spaces, split on whitespace."""
    return re.sub(r"[,;]", " ", text or "").split()


def _fail(cond: bool, msg: str) -> None:
    if cond:
        raise FormatError(msg + "\n")


def pve_node(v: str) -> None:  # PC:319,347-355 pve_verify_node_name
    _fail(not re.fullmatch(r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?", v), "value does not look like a valid node name")


def pve_vmid(v: str) -> None:  # PC:307-317 pve_verify_vmid
    _fail(not re.fullmatch(r"[1-9][0-9]{2,8}", v), "value does not look like a valid VM ID")


def dns_name(v: str) -> None:  # PC:673-684 pve_verify_dns_name (no '_': not a DNS label character)
    label = r"([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)"
    _fail(not re.fullmatch(rf"({label}\.)*{label}", v), "value does not look like a valid DNS name")


def pve_configid(v: str) -> None:  # PC:252-262 pve_verify_configid
    _fail(not re.fullmatch(CONFIGID_RE, v, re.I), f"invalid configuration ID '{v}'")


def pve_tag(v: str) -> None:  # PC:893-901 pve_verify_tag (no '/', no ':' ...)
    _fail(not re.fullmatch(PVE_TAG_RE, v, re.I), "invalid characters in tag")


def _parse_id(v: str, what: str) -> None:  # PC:292-305 parse_id
    _fail(len(v) < 2, f"{what} ID '{v}' cannot be shorter than 2 characters")
    _fail(not re.fullmatch(r"[a-z][a-z0-9\-\_\.]*[a-z0-9]", v, re.I), f"{what} ID '{v}' contains illegal characters")


def pve_storage_id(v: str) -> None:  # PC:264-270 parse_storage_id
    _parse_id(v, "storage")


def pve_poolid(v: str) -> None:  # pve-access-control 5ccd07d src/PVE/AccessControl.pm:1353-1367
    ok = re.fullmatch(r"[A-Za-z0-9\.\-_]+(?:/[A-Za-z0-9\.\-_]+){0,2}", v)
    _fail(not ok, f"pool name '{v}' contains invalid characters")


def urlencoded(v: str) -> None:  # PC:241-250 pve_verify_urlencoded
    _fail(not re.fullmatch(r"[-%a-zA-Z0-9_.!~*'()]*", v), f"invalid urlencoded string: {v}")


def pve_bridge_id(v: str) -> None:  # PC:272-283 parse_bridge_id
    _fail(not re.fullmatch(r"[-_.\w\d]+", v), f"invalid bridge ID '{v}'")


def mac_addr(v: str) -> None:  # PC:454-466 pve_verify_mac_addr
    ok = re.fullmatch(r"[a-f0-9][02468ace](?::[a-f0-9]{2}){5}", v, re.I)
    _fail(not ok, "value does not look like a valid unicast MAC address")


def disk_size(v: str) -> None:  # PC:767-776 pve_verify_disk_size (parse_size: PC:1022)
    _fail(not re.fullmatch(r"\d+(\.\d+)?([KMGT](iB)?)?", v), f"value does not look like a valid disk size: {v}")


def _ip(v: str, version: int, cidr: bool) -> bool:
    try:
        net = ipaddress.ip_interface(v) if cidr else ipaddress.ip_address(v)
    except ValueError:
        return False
    return net.version == version and (not cidr or "/" in v)


def ipv4(v: str) -> None:  # PC:480-490 pve_verify_ipv4 ($IPV4RE)
    _fail(not _ip(v, 4, False), "value does not look like a valid IPv4 address")


def ipv6(v: str) -> None:  # PC:492-502 pve_verify_ipv6 ($IPV6RE)
    _fail(not _ip(v, 6, False), "value does not look like a valid IPv6 address")


def pve_ipv4_config(v: str) -> None:  # PC:622-632 pve_verify_ipv4_config
    ok = v in ("dhcp", "manual") or _ip(v, 4, True)
    _fail(not ok, "value does not look like a valid ipv4 network configuration")


def pve_ipv6_config(v: str) -> None:  # PC:634-645 pve_verify_ipv6_config
    _fail(
        v not in ("auto", "dhcp", "manual") and not _ip(v, 6, True),
        "value does not look like a valid ipv6 network configuration",
    )


def volume_id_or_qm_path(v: str) -> None:  # QS QemuServer.pm:898-925 (pve-volume-id: pve-storage parse_volume_id)
    if v in ("none", "cdrom") or v.startswith("/"):
        return
    _fail(not re.fullmatch(r"([a-z][a-z0-9\-\_\.]*[a-z0-9]):(.+)", v, re.I), f"unable to parse volume ID '{v}'")


def parse_cpuset(v: str) -> list[int]:
    """pve-common 5054082 src/PVE/CpuSet.pm:48-69 parse_cpuset: comma-separated numbers and ranges; dies on others."""
    out: set[int] = set()
    for part in v.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        _fail(not m, f"invalid range: {part}")
        start, end = int(m[1]), int(m[2] or m[1])
        _fail(end < start, f"invalid range: {part} ({end} < {start})")
        out.update(range(start, end + 1))
    return sorted(out)


def pve_cpuset(v: str) -> None:  # QS QemuServer.pm:883-896 pve_verify_cpuset (8.4 5ccd363e: :1072-1085)
    try:
        parse_cpuset(v)
    except FormatError:
        raise FormatError("unable to parse cpuset option\n") from None


NAMED = {
    "string": lambda v: None,  # PC:239 (format 'string-list')
    "pve-cpuset": pve_cpuset,
    "pve-node": pve_node,
    "pve-vmid": pve_vmid,
    "dns-name": dns_name,
    "pve-configid": pve_configid,
    "pve-tag": pve_tag,
    "pve-storage-id": pve_storage_id,
    "pve-poolid": pve_poolid,
    "urlencoded": urlencoded,
    "pve-bridge-id": pve_bridge_id,
    "mac-addr": mac_addr,
    "disk-size": disk_size,
    "ipv4": ipv4,
    "ipv6": ipv6,
    "pve-ipv4-config": pve_ipv4_config,
    "pve-ipv6-config": pve_ipv6_config,
    "pve-volume-id-or-qm-path": volume_id_or_qm_path,
}

# Keys of named property strings whose constraints typetext does not carry: the schema PVE has for them.
SUBKEYS = {
    # QS QemuServer/PCI.pm:29-136 $hostpci_fmt
    ("pve-qm-hostpci", "host"): {"type": "string", "pattern": f"{PCIRE}(;{PCIRE})*"},
    ("pve-qm-hostpci", "mapping"): {"type": "string", "format": "pve-configid"},
    ("pve-qm-hostpci", "romfile"): {"type": "string", "pattern": "[^,;]+"},
    ("pve-qm-hostpci", "mdev"): {"type": "string", "pattern": r"[^/\.:]+"},
    ("pve-qm-hostpci", "vendor-id"): {"type": "string", "pattern": r"^0x[0-9a-fA-F]{4}$"},
    ("pve-qm-hostpci", "device-id"): {"type": "string", "pattern": r"^0x[0-9a-fA-F]{4}$"},
    ("pve-qm-hostpci", "sub-vendor-id"): {"type": "string", "pattern": r"^0x[0-9a-fA-F]{4}$"},
    ("pve-qm-hostpci", "sub-device-id"): {"type": "string", "pattern": r"^0x[0-9a-fA-F]{4}$"},
    # QS QemuServer/Network.pm:140-173 $ipconfig_fmt
    ("pve-qm-ipconfig", "ip"): {"type": "string", "format": "pve-ipv4-config"},
    ("pve-qm-ipconfig", "gw"): {"type": "string", "format": "ipv4"},
    ("pve-qm-ipconfig", "ip6"): {"type": "string", "format": "pve-ipv6-config"},
    ("pve-qm-ipconfig", "gw6"): {"type": "string", "format": "ipv6"},
    # QS QemuServer/CPUConfig.pm:294-303 cputype (any string; validate_vm_cpu_conf below), 321-326 hv-vendor-id
    ("pve-vm-cpu-conf", "cputype"): {"type": "string"},
    ("pve-vm-cpu-conf", "hv-vendor-id"): {"type": "string", "pattern": "[a-zA-Z0-9]{1,12}"},
}

# QS QemuServer/CPUConfig.pm:200-251 built-in models (a subset: a real model outside it is refused, never the
# other way round) and 'host' (line 250: exists when the host arch matches).
CPU_MODELS = {"host", "max", "kvm32", "kvm64", "qemu32", "qemu64", "x86-64-v2", "x86-64-v2-AES", "x86-64-v3"}
CPU_MODELS |= {"x86-64-v4"}


def validate_vm_cpu_conf(parsed: dict) -> None:  # QS QemuServer/CPUConfig.pm:474-501 validate_vm_cpu_conf
    cputype = parsed.get("cputype", "kvm64")
    if cputype.startswith("custom-"):
        raise NotSimulated("custom CPU models")
    _fail(cputype not in CPU_MODELS, f"Built-in cputype '{cputype}' is not defined (missing 'custom-' prefix?)")
    _fail("reported-model" in parsed, "Property 'reported-model' not allowed in VM-specific CPU config.")


VALIDATORS = {"pve-vm-cpu-conf": validate_vm_cpu_conf}


def check_named(name: str, value: str) -> None:
    """PC:975-1017 check_format for a registered (code) format, with its -list and -opt variants."""
    m = re.fullmatch(r"(.*?)(?:-(list|opt))?", name)
    base, kind = m[1], m[2]
    verify = NAMED.get(base)
    if verify is None:
        raise NotSimulated(f"format '{name}'")
    if kind == "list":
        for item in split_list(value):
            verify(item)
    elif kind == "opt":
        if value:
            verify(value)
    else:
        verify(value)
