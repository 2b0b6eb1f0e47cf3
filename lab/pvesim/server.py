"""pvesim: a SIMULATED Proxmox VE API server (lab equipment for tests, not Proxmox).

Speaks the subset of the Proxmox VE 8 REST API (`/api2/json`) that community.proxmox's proxmox_kvm,
proxmox_snap and inventory plugin, and the role proxmox_gpu_vm, call; stateful (nodes with PCI devices,
cluster PCI mappings, VMs with current and pending configuration, snapshots, tasks with real UPIDs);
records every write. Behaviour follows qemu-server (PVE/API2/Qemu.pm, PVE/QemuServer.pm), see README.md.
Parameters are checked against the published API schema (pve-api-schema.json) like PVE's parameter
verification does; tests check every answer against the same schema.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import secrets
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

SCHEMA_PATH = Path(__file__).with_name("pve-api-schema.json")

# Every endpoint the simulator answers ("METHOD /path" as in the API schema).
SERVED_ENDPOINTS = [
    "POST /access/ticket",
    "GET /version",
    "GET /nodes",
    "GET /pools",
    "GET /cluster/resources",
    "GET /cluster/mapping/pci",
    "GET /nodes/{node}/hardware/pci",
    "GET /nodes/{node}/qemu",
    "GET /nodes/{node}/lxc",
    "POST /nodes/{node}/qemu/{vmid}/clone",
    "GET /nodes/{node}/qemu/{vmid}/config",
    "PUT /nodes/{node}/qemu/{vmid}/config",
    "GET /nodes/{node}/qemu/{vmid}/pending",
    "GET /nodes/{node}/qemu/{vmid}/status/current",
    "POST /nodes/{node}/qemu/{vmid}/status/start",
    "POST /nodes/{node}/qemu/{vmid}/status/stop",
    "POST /nodes/{node}/qemu/{vmid}/status/shutdown",
    "GET /nodes/{node}/qemu/{vmid}/snapshot",
    "POST /nodes/{node}/qemu/{vmid}/snapshot",
    "GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
    "GET /nodes/{node}/tasks/{upid}/status",
    "GET /nodes/{node}/tasks/{upid}/log",
]

# qemu-server's $fast_plug_option: applied at once even while the VM runs.
FAST_PLUG = {"name", "onboot", "shares", "vmstatestorage", "startup", "description", "protection", "tags", "hookscript"}
# Options whose change needs no restart (cloud-init values are read at the next start, but are not pending).
CLOUDINIT = {"ciuser", "cipassword", "sshkeys", "ipconfig0", "ipconfig1", "nameserver", "searchdomain", "citype"}


class ApiError(Exception):
    def __init__(self, code: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.code, self.message, self.errors = code, message, errors


def _path_template(path: str) -> tuple[str, dict]:
    """Map a concrete path to its schema template and the path parameters."""
    parts = path.strip("/").split("/")
    for ep in SERVED_ENDPOINTS:
        tmpl = ep.split(" ", 1)[1].strip("/").split("/")
        if len(tmpl) != len(parts):
            continue
        params = {}
        for t, p in zip(tmpl, parts, strict=True):
            if t.startswith("{"):
                params[t[1:-1]] = unquote(p)
            elif t != p:
                break
        else:
            return "/" + "/".join(tmpl), params
    raise ApiError(501, f"Method '{path}' not implemented")


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (tests run with validate_certs false, as against a fresh PVE)."""
    cert, key = directory / "pvesim.crt", directory / "pvesim.key"
    if not cert.exists():
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
        )
    return cert, key


class PveSim:
    """The cluster state and the API semantics."""

    def __init__(self, cluster: dict, schema_path: Path = SCHEMA_PATH):
        self.schema = json.loads(schema_path.read_text())
        self.lock = threading.RLock()
        self.version = cluster.get("version", "8.3.2")
        self.nodes = copy.deepcopy(cluster["nodes"])  # name -> {"pci": [...], "status": "online"}
        self.mappings = copy.deepcopy(cluster.get("mappings", []))
        self.users = dict(cluster.get("users", {}))  # "root@pam" -> password
        self.tokens = dict(cluster.get("tokens", {}))  # "root@pam!gpufleet" -> secret
        self.vms: dict[int, dict] = {}
        for vm in cluster.get("vms", []):
            self.vms[int(vm["vmid"])] = {
                "vmid": int(vm["vmid"]),
                "node": vm["node"],
                "status": vm.get("status", "stopped"),
                "template": int(vm.get("template", 0)),
                "config": dict(vm["config"]),
                "pending": {},
                "pending_delete": [],
                "snapshots": [],
                "agent_ip": vm.get("agent_ip"),
            }
        self.next_ip = 10
        self.tasks: dict[str, dict] = {}
        self.tickets: dict[str, str] = {}
        self.writes: list[dict] = []  # every POST/PUT/DELETE that reached the API, in order
        self.exchanges: list[dict] = []  # every answer: endpoint, data (for the schema test)

    # ---- helpers -------------------------------------------------------------------------------
    def _upid(self, node: str, kind: str, vmid: int, user: str) -> str:
        pid, start = os.getpid() & 0xFFFFFFFF, int(time.time())
        upid = f"UPID:{node}:{pid:08X}:{secrets.randbelow(1 << 32):08X}:{start:08X}:{kind}:{vmid}:{user}:"
        return upid

    def _task(self, node: str, kind: str, vmid: int, user: str, error: str | None = None) -> str:
        upid = self._upid(node, kind, vmid, user)
        fields = upid.split(":")
        self.tasks[upid] = {
            "upid": upid,
            "node": node,
            "pid": int(fields[2], 16),
            "pstart": int(fields[3], 16),
            "starttime": int(fields[4], 16),
            "type": kind,
            "id": str(vmid),
            "user": user,
            "status": "stopped",
            "exitstatus": error or "OK",
            "log": [error or "TASK OK"],
        }
        return upid

    def _vm(self, node: str, vmid: str) -> dict:
        vm = self.vms.get(int(vmid))
        if vm is None or vm["node"] != node:
            raise ApiError(500, f"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist")
        return vm

    @staticmethod
    def _digest(conf: dict) -> str:
        return hashlib.sha1(json.dumps(conf, sort_keys=True).encode()).hexdigest()

    def _typed(self, iface: str, data: dict) -> dict:
        """Values typed as PVE's JSON answers type them (integers and 0/1 booleans stay numbers)."""
        fields = self.schema["interfaces"][iface]["fields"]
        out = {}
        for k, v in data.items():
            t = fields.get(k, {}).get("type", "string")
            if t in ("number", "boolean"):
                out[k] = int(v) if not isinstance(v, float) else v
            else:
                out[k] = str(v)
        return out

    def _check_params(self, endpoint: str, params: dict) -> None:
        spec = self.schema["endpoints"][endpoint]["params"]
        errors = {
            k: "property is not defined in schema and the schema does not allow additional properties"
            for k in params
            if k not in spec
        }
        errors.update(
            {
                k: "property is missing and it is not optional"
                for k, s in spec.items()
                if s["required"] and k not in params
            }
        )
        if errors:
            raise ApiError(400, "Parameter verification failed.", errors)

    # ---- auth ----------------------------------------------------------------------------------
    def authenticate(self, headers, endpoint: str, method: str) -> str:
        auth = headers.get("Authorization", "")
        if auth.startswith("PVEAPIToken="):
            m = re.match(r"^PVEAPIToken=([^!]+![^=]+)=(.+)$", auth)
            if m and self.tokens.get(m[1]) == m[2]:
                return m[1]
            raise ApiError(401, "invalid token value!")
        cookie = headers.get("Cookie", "")
        m = re.search(r"PVEAuthCookie=([^;]+)", cookie)
        if m and unquote(m[1]) in self.tickets:
            if method != "GET" and headers.get("CSRFPreventionToken") != "csrf-" + unquote(m[1])[-16:]:
                raise ApiError(401, "Permission check failed (invalid csrf token)")
            return self.tickets[unquote(m[1])]
        raise ApiError(401, "No ticket")

    # ---- dispatch ------------------------------------------------------------------------------
    def handle(self, method: str, path: str, params: dict, headers) -> object:
        with self.lock:
            tmpl, pp = _path_template(path)
            endpoint = f"{method} {tmpl}"
            if endpoint not in SERVED_ENDPOINTS:
                raise ApiError(501, f"Method '{method} {path}' not implemented")
            self._check_params(endpoint, params)
            if endpoint == "POST /access/ticket":
                data = self.ticket(params)
            else:
                user = self.authenticate(headers, endpoint, method)
                if method != "GET":
                    self.writes.append(
                        {
                            "t_ns": time.time_ns(),
                            "endpoint": endpoint,
                            "path": path,
                            "user": user,
                            "params": dict(params),
                        }
                    )
                handler = getattr(self, "ep_" + re.sub(r"[^a-z]+", "_", endpoint.lower()).strip("_"))
                data = handler(user=user, **pp, **params)
            self.exchanges.append({"endpoint": endpoint, "data": copy.deepcopy(data)})
            return data

    def ticket(self, params: dict) -> dict:
        username, password = params.get("username", ""), params.get("password", "")
        if username not in self.users or self.users[username] != password:
            raise ApiError(401, "authentication failure")
        ticket = f"PVE:{username}:{int(time.time()):08X}::{secrets.token_hex(16)}"
        self.tickets[ticket] = username
        return {
            "username": username,
            "ticket": ticket,
            "CSRFPreventionToken": "csrf-" + ticket[-16:],
            "cap": {"vms": {"VM.Config.HWType": 1}},
        }

    # ---- endpoints ---------------------------------------------------------------------------
    def ep_get_version(self, user, **_):
        return {"version": self.version, "release": self.version.rsplit(".", 1)[0], "repoid": "d4bcd4a8"}

    def ep_get_nodes(self, user, **_):
        return [
            {
                "node": n,
                "status": v.get("status", "online"),
                "type": "node",
                "id": f"node/{n}",
                "maxcpu": 128,
                "maxmem": 1 << 40,
                "uptime": 86400,
                "level": "",
            }
            for n, v in self.nodes.items()
        ]

    def ep_get_pools(self, user, **_):
        return []

    def _resource(self, vm: dict) -> dict:
        conf = self._effective(vm, current=True)
        res = {
            "id": f"qemu/{vm['vmid']}",
            "type": "qemu",
            "vmid": vm["vmid"],
            "node": vm["node"],
            "name": conf.get("name", f"VM {vm['vmid']}"),
            "status": vm["status"],
            "template": vm["template"],
            "maxcpu": int(conf.get("cores", 1)) * int(conf.get("sockets", 1)),
            "maxmem": int(str(conf.get("memory", 2048)).split(",")[0].replace("current=", "")) << 20,
            "uptime": 100 if vm["status"] == "running" else 0,
        }
        if conf.get("tags"):
            res["tags"] = conf["tags"]
        return res

    def ep_get_cluster_resources(self, user, type=None, **_):  # noqa: A002 (the API's parameter name)
        out = [self._resource(vm) for vm in sorted(self.vms.values(), key=lambda v: v["vmid"])]
        if type in (None, "node"):
            out += [{"id": f"node/{n}", "type": "node", "node": n, "status": "online"} for n in self.nodes]
        return [r for r in out if type is None or r["type"] == "qemu"]

    def ep_get_cluster_mapping_pci(self, user, **_):
        return copy.deepcopy(self.mappings)

    def ep_get_nodes_node_hardware_pci(self, user, node, **_):
        if node not in self.nodes:
            raise ApiError(500, f"no such node '{node}'")
        return copy.deepcopy(self.nodes[node]["pci"])

    def ep_get_nodes_node_qemu(self, user, node, **_):
        out = []
        for vm in sorted(self.vms.values(), key=lambda v: v["vmid"]):
            if vm["node"] == node:
                r = self._resource(vm)
                out.append(
                    {k: r[k] for k in ("vmid", "name", "status", "maxmem", "uptime") if k in r}
                    | {"cpus": r["maxcpu"], "template": vm["template"]}
                    | ({"tags": r["tags"]} if "tags" in r else {})
                )
        return out

    def ep_get_nodes_node_lxc(self, user, node, **_):
        return []

    def _effective(self, vm: dict, current: bool) -> dict:
        conf = dict(vm["config"])
        if not current:
            conf.update(vm["pending"])
            for k in vm["pending_delete"]:
                conf.pop(k, None)
        return conf

    def ep_post_nodes_node_qemu_vmid_clone(
        self, user, node, vmid, newid, name=None, full=None, storage=None, target=None, **_
    ):
        src = self._vm(node, vmid)
        newid = int(newid)
        if newid in self.vms:
            raise ApiError(500, f"unable to create VM {newid}: config file already exists")
        if src["status"] == "running" and not src["template"]:
            raise ApiError(500, "cannot clone a running VM without snapshot")  # linked clones of running VMs too
        if not src["template"] and not int(full or 0):
            raise ApiError(500, "linked clone feature is not supported for a VM that is not a template")
        conf = dict(src["config"])
        conf.pop("template", None)
        for k, v in list(conf.items()):
            m = re.match(r"^(?:scsi|virtio|sata|ide|efidisk)\d+$", k)
            if m and "media=cdrom" not in v:
                store, rest = v.split(":", 1)
                disk = re.sub(r"^(?:base-\d+-disk-(\d+)/)?(?:vm|base)-\d+-disk-(\d+)", r"vm-%d-disk-\2" % newid, rest)  # noqa: UP031
                conf[k] = f"{storage or store}:{disk}"
            if m and "media=cdrom" in v and "cloudinit" in v:
                conf[k] = re.sub(r"vm-\d+-cloudinit", f"vm-{newid}-cloudinit", v)
            if re.match(r"^net\d+$", k):  # clone_vm gives every NIC a new MAC address
                conf[k] = re.sub(
                    r"=([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}",
                    "=BC:24:11:%02X:%02X:%02X" % (newid >> 16 & 255, newid >> 8 & 255, newid & 255),  # noqa: UP031
                    v,
                    count=1,
                )
        conf["name"] = name or f"Copy-of-VM-{conf.get('name', vmid)}"
        conf["vmgenid"] = "00000000-0000-4000-8000-%012x" % newid  # noqa: UP031
        conf["smbios1"] = "uuid=00000000-0000-4000-9000-%012x" % newid  # noqa: UP031
        self.vms[newid] = {
            "vmid": newid,
            "node": target or node,
            "status": "stopped",
            "template": 0,
            "config": conf,
            "pending": {},
            "pending_delete": [],
            "snapshots": [],
            "agent_ip": None,
        }
        return self._task(node, "qmclone", int(vmid), user)

    def ep_get_nodes_node_qemu_vmid_config(self, user, node, vmid, current=None, snapshot=None, **_):
        vm = self._vm(node, vmid)
        conf = self._effective(vm, current=bool(int(current or 0)))
        conf["digest"] = self._digest(vm["config"])
        return self._typed("nodesQemuConfigVmConfig", conf)

    def _check_config_perm(self, user: str, params: dict) -> None:
        # PVE/API2/Qemu.pm $check_vm_modify_config_perm: only root@pam itself (not a token) may set args.
        if "args" in params and user != "root@pam":
            raise ApiError(500, "only root can set 'args' config")

    def ep_put_nodes_node_qemu_vmid_config(self, user, node, vmid, delete=None, digest=None, **params):
        vm = self._vm(node, vmid)
        if digest and digest != self._digest(vm["config"]):
            raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
        self._check_config_perm(user, params)
        if "efidisk0" in params:
            self._check_efidisk(params["efidisk0"])
            m = re.match(r"^([\w\-]+):(\d+)(,.*)?$", params["efidisk0"])
            if m:  # allocation syntax STORAGE:SIZE: a new volume is allocated
                n = sum(1 for v in vm["config"].values() if isinstance(v, str) and f"vm-{vmid}-disk-" in v)
                params["efidisk0"] = f"{m[1]}:vm-{vmid}-disk-{n}{m[3] or ''},size=4M"
        if "sshkeys" in params:
            params["sshkeys"] = quote(unquote(params["sshkeys"]), safe="")
        if "tags" in params:
            params["tags"] = ";".join(sorted({t for t in re.split(r"[;, ]+", params["tags"]) if t}))
        deletes = [d for d in re.split(r"[,; ]+", delete or "") if d]
        running = vm["status"] == "running"
        for k, v in params.items():
            if not running or k in FAST_PLUG or k in CLOUDINIT:
                vm["config"][k] = v
                vm["pending"].pop(k, None)
            else:
                vm["pending"][k] = v
        for k in deletes:
            if not running or k in FAST_PLUG or k in CLOUDINIT:
                vm["config"].pop(k, None)
            elif k in vm["config"] and k not in vm["pending_delete"]:
                vm["pending_delete"].append(k)
        # PVE::QemuConfig->cleanup_pending: pending values equal to the current ones are dropped
        for k in [k for k, v in vm["pending"].items() if vm["config"].get(k) == v]:
            del vm["pending"][k]
        return None

    @staticmethod
    def _check_efidisk(value: str) -> None:
        """PVE's property-string parser for efidisk0 (format, efitype, pre-enrolled-keys are enums/booleans)."""
        allowed = {"format": {"raw", "qcow2", "vmdk"}, "efitype": {"2m", "4m"}}
        for opt in value.split(",")[1:]:
            k, _, v = opt.partition("=")
            if k in allowed and v not in allowed[k]:
                raise ApiError(
                    400,
                    "Parameter verification failed.",
                    {
                        "efidisk0": f"invalid format - format error\nefidisk0.{k}: value '{v}' does not "
                        f"have a value in the enumeration '{', '.join(sorted(allowed[k]))}'"
                    },
                )
            if k == "pre-enrolled-keys" and not re.match(r"^(?i:1|0|on|off|yes|no|true|false)$", v):
                raise ApiError(
                    400,
                    "Parameter verification failed.",
                    {
                        "efidisk0": f"invalid format - efidisk0.pre-enrolled-keys: type check ('boolean') failed - got '{v}'"  # noqa: E501
                    },
                )

    def ep_get_nodes_node_qemu_vmid_pending(self, user, node, vmid, **_):
        vm = self._vm(node, vmid)
        out = []
        for k in sorted(set(vm["config"]) | set(vm["pending"]) | set(vm["pending_delete"])):
            item = {"key": k}
            if k in vm["config"]:
                item["value"] = vm["config"][k]
            if k in vm["pending"]:
                item["pending"] = vm["pending"][k]
            if k in vm["pending_delete"]:
                item["delete"] = 1
            out.append({kk: (str(vv) if kk in ("value", "pending") else vv) for kk, vv in item.items()})
        return out

    def ep_get_nodes_node_qemu_vmid_status_current(self, user, node, vmid, **_):
        vm = self._vm(node, vmid)
        r = self._resource(vm)
        out = {
            "vmid": vm["vmid"],
            "status": vm["status"],
            "name": r["name"],
            "cpus": r["maxcpu"],
            "maxmem": r["maxmem"],
            "uptime": r["uptime"],
            "qmpstatus": vm["status"],
            "ha": {"managed": 0},
        }
        if self._effective(vm, current=True).get("agent", "0").split(",")[0] in ("1", "enabled=1"):
            out["agent"] = 1
        return out

    def _pci_problem(self, vm: dict, conf: dict) -> str | None:
        """What qemu-server's vm_start refuses about hostpci (PVE::QemuServer::PCI)."""
        node = self.nodes[vm["node"]]
        q35 = "q35" in conf.get("machine", "")
        for k in sorted(k for k in conf if re.match(r"^hostpci\d+$", k)):
            opts = dict(o.split("=", 1) if "=" in o else ("host", o) for o in conf[k].split(","))
            if opts.get("pcie") == "1" and not q35:
                return "q35 machine model is not enabled"
            if "mapping" in opts:
                mp = next((m for m in self.mappings if m["id"] == opts["mapping"]), None)
                paths = [dict(e.split("=", 1) for e in entry.split(",")) for entry in (mp or {}).get("map", [])]
                path = next((p["path"] for p in paths if p.get("node") == vm["node"]), None)
                if path is None:
                    return f"PCI device mapping not found for '{opts['mapping']}'"
            else:
                path = opts["host"] if opts["host"].count(":") == 2 else "0000:" + opts["host"]
            if not any(d["id"] == path or d["id"].startswith(path + ".") for d in node["pci"]):
                return f"cannot prepare PCI pci device {path}, no device found"
            for other in self.vms.values():
                if other is vm or other["status"] != "running" or other["node"] != vm["node"]:
                    continue
                oconf = other["config"]
                for ok in (x for x in oconf if re.match(r"^hostpci\d+$", x)):
                    if path in oconf[ok] or (
                        "mapping" in opts and f"mapping={opts['mapping']}" in oconf[ok].split(",")
                    ):
                        return f"PCI device '{path}' already in use by VMID '{other['vmid']}'"
        return None

    def ep_post_nodes_node_qemu_vmid_status_start(self, user, node, vmid, **_):
        vm = self._vm(node, vmid)
        if vm["status"] == "running":
            return self._task(node, "qmstart", vm["vmid"], user, "VM already running")
        # vm_start applies the pending configuration first (vmconfig_apply_pending)
        conf = self._effective(vm, current=False)
        problem = self._pci_problem(vm, conf)
        if problem:
            return self._task(node, "qmstart", vm["vmid"], user, problem)
        vm["config"], vm["pending"], vm["pending_delete"] = conf, {}, []
        vm["status"] = "running"
        if vm["agent_ip"] is None:
            self.next_ip += 1
            vm["agent_ip"] = f"192.0.2.{self.next_ip}"
        return self._task(node, "qmstart", vm["vmid"], user)

    def _stop(self, node, vmid, user, kind):
        vm = self._vm(node, vmid)
        vm["status"] = "stopped"
        return self._task(node, kind, vm["vmid"], user)

    def ep_post_nodes_node_qemu_vmid_status_stop(self, user, node, vmid, **_):
        return self._stop(node, vmid, user, "qmstop")

    def ep_post_nodes_node_qemu_vmid_status_shutdown(self, user, node, vmid, **_):
        return self._stop(node, vmid, user, "qmshutdown")

    def ep_get_nodes_node_qemu_vmid_snapshot(self, user, node, vmid, **_):
        vm = self._vm(node, vmid)
        out = [dict(s) for s in vm["snapshots"]]
        current = {
            "name": "current",
            "description": "You are here!",
            "running": int(vm["status"] == "running"),
            "digest": self._digest(vm["config"]),
        }
        if vm["snapshots"]:
            current["parent"] = vm["snapshots"][-1]["name"]
        return out + [current]

    def ep_post_nodes_node_qemu_vmid_snapshot(self, user, node, vmid, snapname, description=None, vmstate=None, **_):
        vm = self._vm(node, vmid)
        if any(s["name"] == snapname for s in vm["snapshots"]):
            raise ApiError(500, f"snapshot name '{snapname}' already used")
        conf = vm["config"]
        if int(vmstate or 0) and any(re.match(r"^hostpci\d+$", k) for k in conf):
            return self._task(node, "qmsnapshot", vm["vmid"], user, "cannot snapshot VM state with PCI passthrough")
        snap = {"name": snapname, "description": description or "", "snaptime": int(time.time())}
        if vm["snapshots"]:
            snap["parent"] = vm["snapshots"][-1]["name"]
        vm["snapshots"].append(snap)
        return self._task(node, "qmsnapshot", vm["vmid"], user)

    def ep_get_nodes_node_qemu_vmid_agent_network_get_interfaces(self, user, node, vmid, **_):
        vm = self._vm(node, vmid)
        conf = vm["config"]
        if conf.get("agent", "0").split(",")[0] not in ("1", "enabled=1"):
            raise ApiError(500, "No QEMU guest agent configured")
        if vm["status"] != "running":
            raise ApiError(500, f"VM {vmid} is not running")
        return {
            "result": [
                {
                    "name": "lo",
                    "hardware-address": "00:00:00:00:00:00",
                    "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8}],
                },
                {
                    "name": "eth0",
                    "hardware-address": "bc:24:11:00:%02x:%02x" % (vm["vmid"] >> 8 & 255, vm["vmid"] & 255),  # noqa: UP031
                    "ip-addresses": [
                        {"ip-address": vm["agent_ip"], "ip-address-type": "ipv4", "prefix": 24},
                        {"ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", "prefix": 64},
                    ],
                },
            ]
        }

    def ep_get_nodes_node_tasks_upid_status(self, user, node, upid, **_):
        task = self.tasks.get(upid)
        if task is None:
            raise ApiError(500, f"unable to parse worker upid '{upid}'")
        return {k: v for k, v in task.items() if k != "log"}

    def ep_get_nodes_node_tasks_upid_log(self, user, node, upid, **_):
        task = self.tasks.get(upid)
        if task is None:
            raise ApiError(500, f"unable to parse worker upid '{upid}'")
        return [{"n": i + 1, "t": line} for i, line in enumerate(task["log"])]


class _Handler(BaseHTTPRequestHandler):
    sim: PveSim  # set on the subclass

    def log_message(self, *args):  # quiet: tests read sim.writes and sim.exchanges instead
        pass

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            body = self.rfile.read(length).decode()
            if self.headers.get("Content-Type", "").startswith("application/json"):
                params.update({k: v for k, v in json.loads(body).items() if v is not None})
            else:
                params.update(dict(parse_qsl(body, keep_blank_values=True)))
        if not url.path.startswith("/api2/json/"):
            self._answer(404, {"data": None})
            return
        try:
            data = self.sim.handle(method, url.path[len("/api2/json") :], params, self.headers)
            self._answer(200, {"data": data})
        except ApiError as e:
            body = {"data": None, "message": e.message + "\n"}
            if e.errors:
                body["errors"] = e.errors
            self._answer(e.code, body, reason=e.message)

    def _answer(self, code: int, body: dict, reason: str | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code, reason)
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802
        self._serve("GET")

    def do_POST(self):  # noqa: N802
        self._serve("POST")

    def do_PUT(self):  # noqa: N802
        self._serve("PUT")

    def do_DELETE(self):  # noqa: N802
        self._serve("DELETE")


class PveSimServer:
    """Run a PveSim over HTTPS on 127.0.0.1 (port 0: the kernel picks a free one)."""

    def __init__(self, sim: PveSim, certdir: Path):
        handler = type("Handler", (_Handler,), {"sim": sim})
        self.sim = sim
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        cert, key = make_cert(certdir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> PveSimServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
