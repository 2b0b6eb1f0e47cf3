"""pvesim: a SIMULATED Proxmox VE API server (lab equipment for tests, not Proxmox).

Speaks the subset of the Proxmox VE REST API (`/api2/json`, releases 8.4 and 9.1) that community.proxmox's
proxmox_kvm, proxmox_snap and inventory plugin, and the role proxmox_gpu_vm, call; stateful (nodes with PCI
devices and storages, cluster PCI mappings, users and tokens with ACLs, VMs with current and pending
configuration, snapshots, tasks with real UPIDs); records every write. Every request is verified against the
release's API schema (schema.py, from PVE's apidata.js) with PVE's messages; the behaviour behind it follows
qemu-server (vmconfig.py, vmstart.py, perms.py). See README.md for every rule and its source.
"""

from __future__ import annotations

import copy
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
from urllib.parse import parse_qsl, unquote, urlsplit

from pvesim.endpoints import SERVED_ENDPOINTS
from pvesim.formats import NotSimulated, split_list
from pvesim.perms import ALL_PRIVS, PermError, Perms
from pvesim.schema import Schema, release_of
from pvesim.vmconfig import ConfigMixin
from pvesim.vmstart import StartMixin

SIMULATOR = "pvesim (simulated Proxmox VE API, not Proxmox)"
DEFAULT_STORAGES = {
    "local": {"type": "dir", "content": "iso,vztmpl,backup", "shared": 0},
    "local-lvm": {"type": "lvmthin", "content": "images,rootdir", "shared": 0},
}


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
    raise ApiError(501, f"Method '{path}' not implemented\n")


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (tests run with validate_certs false, as against a fresh PVE)."""
    cert, key = directory / "pvesim.crt", directory / "pvesim.key"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
            + ["-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
        )
    return cert, key


class PveSim(ConfigMixin, StartMixin):
    """The cluster state and the API semantics."""

    def __init__(self, cluster: dict):
        self.lock = threading.RLock()
        self.version = cluster.get("version", "8.4.1")
        self.schema = Schema(release_of(self.version))
        self.nodes = copy.deepcopy(cluster["nodes"])  # name -> {"pci": [...], "drivers": {}, "storage": [...]}
        self.storages = copy.deepcopy(cluster.get("storages", DEFAULT_STORAGES))
        self.mappings = [{"description": "", **m} for m in copy.deepcopy(cluster.get("mappings", []))]
        self.perms = Perms(cluster.get("users", {}), cluster.get("tokens", {}))
        # named fault modes (deliberate differences from a healthy cluster): start_fails {vmid: message}
        self.faults = copy.deepcopy(cluster.get("faults", {}))
        self.vms: dict[int, dict] = {}
        for vm in cluster.get("vms", []):
            self.vms[int(vm["vmid"])] = self._new_vm(
                int(vm["vmid"]),
                vm["node"],
                dict(vm["config"]),
                vm.get("status", "stopped"),
                int(vm.get("template", 0)),
                vm.get("agent_ip"),
            )
        self.next_ip = 10
        self.tasks: dict[str, dict] = {}
        self.tickets: dict[str, str] = {}
        self.writes: list[dict] = []  # every POST/PUT/DELETE that reached the API, in order
        self.exchanges: list[dict] = []  # every answer: endpoint, data (for the schema test)

    def snapshot(self) -> PveSim:
        """A copy of the cluster as it is now, with its own lock (the schema is shared: it is only read). Tests start
        several scenarios from one provisioned cluster instead of provisioning it again for each."""
        with self.lock:
            new = copy.copy(self)
            for key, value in vars(self).items():
                if key not in ("lock", "schema"):
                    setattr(new, key, copy.deepcopy(value))
        new.lock = threading.RLock()
        return new

    # ---- helpers -------------------------------------------------------------------------------
    @staticmethod
    def api_error(code: int, message: str, errors: dict | None = None) -> ApiError:
        return ApiError(code, message, errors)

    @staticmethod
    def param_exc(errors: dict) -> ApiError:
        return ApiError(400, "Parameter verification failed.\n", errors)

    @staticmethod
    def not_simulated(what: str) -> ApiError:
        return ApiError(501, f"{SIMULATOR} does not simulate {what}\n")

    def _task(self, node: str, kind: str, vmid: int, user: str, error: str | None = None, log=None) -> str:
        pid, start = os.getpid() & 0xFFFFFFFF, int(time.time())
        upid = f"UPID:{node}:{pid:08X}:{secrets.randbelow(1 << 32):08X}:{start:08X}:{kind}:{vmid}:{user}:"
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
            "log": [*(log or []), f"TASK ERROR: {error}" if error else "TASK OK"],
        }
        return upid

    def _vm(self, node: str, vmid: str) -> dict:
        vm = self.vms.get(int(vmid))
        if vm is None or vm["node"] != node:
            raise ApiError(500, f"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist\n")
        return vm

    def _storages(self, node: str) -> dict:
        names = self.nodes[node].get("storage", list(self.storages))
        return {s: self.storages[s] for s in names}

    # ---- auth ----------------------------------------------------------------------------------
    def authenticate(self, headers, method: str) -> str:
        auth = headers.get("Authorization", "")
        if auth.startswith("PVEAPIToken="):
            m = re.match(r"^PVEAPIToken=([^!]+![^=]+)=(.+)$", auth)
            if m and m[1] in self.perms.tokens and self.perms.tokens[m[1]]["secret"] == m[2]:
                return m[1]
            raise ApiError(401, "invalid token value!\n")
        m = re.search(r"PVEAuthCookie=([^;]+)", headers.get("Cookie", ""))
        if m and unquote(m[1]) in self.tickets:
            if method != "GET" and headers.get("CSRFPreventionToken") != "csrf-" + unquote(m[1])[-16:]:
                raise ApiError(401, "Permission check failed (invalid csrf token)\n")
            return self.tickets[unquote(m[1])]
        raise ApiError(401, "No ticket\n")

    # ---- dispatch ------------------------------------------------------------------------------
    def handle(self, method: str, path: str, params: dict, headers) -> object:
        with self.lock:
            try:
                return self._handle(method, path, params, headers)
            except PermError as e:
                raise ApiError(e.code, e.message, e.errors) from None
            except NotSimulated as e:
                raise self.not_simulated(str(e)) from None

    def _handle(self, method: str, path: str, params: dict, headers) -> object:
        tmpl, pp = _path_template(path)
        endpoint = f"{method} {tmpl}"
        if endpoint not in SERVED_ENDPOINTS:
            raise ApiError(501, f"Method '{method} {path}' not implemented\n")
        # PVE's order: authentication (HS auth_handler), the method's permissions (check_api2_permissions), then
        # the parameter verification (RESTHandler handle -> PVE::JSONSchema::validate), then the method
        if endpoint == "POST /access/ticket":
            self._verify(endpoint, params, pp)
            data = self.ticket(params)
        else:
            user = self.authenticate(headers, method)
            if "!" in user and not self.schema.endpoint(endpoint)["allowtoken"]:
                raise ApiError(403, f"Permission check failed (URI '{path}' not available with API token)\n")
            if method != "GET":
                self.writes.append(
                    {"t_ns": time.time_ns(), "endpoint": endpoint, "path": path, "user": user, "params": dict(params)}
                )
            self.perms.check_api(user, self.schema.endpoint(endpoint)["permissions"], {**params, **pp})
            self._verify(endpoint, params, pp)
            handler = getattr(self, "ep_" + re.sub(r"[^a-z]+", "_", endpoint.lower()).strip("_"))
            data = handler(user=user, **pp, **params)
        self.exchanges.append({"endpoint": endpoint, "data": copy.deepcopy(data)})
        return data

    def _verify(self, endpoint: str, params: dict, path_params: dict) -> None:
        errors = self.schema.param_errors(endpoint, {**params, **path_params})
        if errors:
            raise self.param_exc(errors)

    def ticket(self, params: dict) -> dict:
        username, password = params.get("username", ""), params.get("password", "")
        if username not in self.perms.users or self.perms.users[username].get("password") != password:
            raise ApiError(401, "authentication failure\n")
        ticket = f"PVE:{username}:{int(time.time()):08X}::{secrets.token_hex(16)}"
        self.tickets[ticket] = username
        return {"username": username, "ticket": ticket, "CSRFPreventionToken": "csrf-" + ticket[-16:]}

    # ---- read-only endpoints -------------------------------------------------------------------
    def ep_get_access_permissions(self, user, path=None, userid=None, **_):
        """pve-access-control 5ccd07d src/PVE/API2/AccessControl.pm:509-574 (8.4: stable-bookworm 0f258e7 :552-617):
        the caller's own privileges (or an owned token's; another's needs Sys.Audit on /access) on `path`, as
        RPCEnvironment permissions computes them (root@pam: every privilege; a token: its user's, or with privilege
        separation the intersection), {path: {privilege: 1}}, {} without any. The whole tree (no `path`) is not
        simulated."""
        uid = userid or user
        owned = "!" in uid and uid.split("!", 1)[0] == user
        if uid != user and not owned:
            self.perms.check(user, "/access", ["Sys.Audit"])
        if path is None:
            raise self.not_simulated("GET /access/permissions without path (get_effective_permissions)")
        if "!" in uid and uid not in self.perms.tokens:
            return {}
        privs = self.perms.privs(uid, path)
        privs = ALL_PRIVS[self.schema.release] if privs is None else sorted(privs)
        return {path: {p: 1 for p in privs}} if privs else {}

    def ep_get_version(self, user, **_):
        return {"version": self.version, "release": self.version.rsplit(".", 1)[0], "repoid": "d4bcd4a8"}

    def ep_get_nodes(self, user, **_):
        return [  # id and type: not in the schema, but PVE returns them (schema.py UNDOCUMENTED_FIELDS)
            {"id": f"node/{n}", "node": n, "type": "node", "status": v.get("status", "online"), "level": ""}
            | {"maxcpu": 128, "maxmem": 1 << 40, "uptime": 86400}
            for n, v in self.nodes.items()
        ]

    def ep_get_pools(self, user, **_):
        return []

    def _audit(self, user: str, vmid: int) -> bool:
        return self.perms.has(user, f"/vms/{vmid}", ["VM.Audit"])

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
            "maxmem": int(re.sub(r"^(current=)?(\d+).*", r"\2", str(conf.get("memory", 512)))) << 20,
            "uptime": 100 if vm["status"] == "running" else 0,
        }
        if conf.get("tags"):
            res["tags"] = conf["tags"]
        return res

    def ep_get_cluster_resources(self, user, type=None, **_):  # noqa: A002 (the API's parameter name)
        vms = [self._resource(vm) for vm in sorted(self.vms.values(), key=lambda v: v["vmid"])]
        vms = [r for r in vms if self._audit(user, r["vmid"])]
        nodes = [
            {"id": f"node/{n}", "type": "node", "node": n, "status": v.get("status", "online"), "level": ""}
            for n, v in self.nodes.items()
        ]
        if type == "vm":
            return vms
        if type == "node":
            return nodes
        if type is None:
            return vms + nodes
        raise self.not_simulated(f"/cluster/resources?type={type}")

    def ep_get_cluster_mapping_pci(self, user, **_):
        privs = ["Mapping.Modify", "Mapping.Use", "Mapping.Audit"]
        return [copy.deepcopy(m) for m in self.mappings if self.perms.has(user, f"/mapping/pci/{m['id']}", privs, True)]

    def _node(self, node: str) -> dict:
        if node not in self.nodes:
            raise ApiError(500, f"no such node '{node}'\n")
        return self.nodes[node]

    def ep_get_nodes_node_hardware_pci(self, user, node, **params):
        # pve-manager 14a22df3 PVE/API2/Hardware/PCI.pm:13,114-133: classes 05 (memory), 06 (bridges) and 0b
        # (processors) are left out unless pci-class-blacklist says otherwise
        classes = "|".join(split_list(params.get("pci-class-blacklist", "05;06;0b")))
        devs = self._node(node)["pci"]
        return [copy.deepcopy(d) for d in devs if not classes or not re.match(rf"^0x(?:{classes})", d["class"])]

    def ep_get_nodes_node_storage(self, user, node, **_):
        self._node(node)
        out = []
        for name, s in self._storages(node).items():
            if self.perms.has(user, f"/storage/{name}", ["Datastore.Audit", "Datastore.AllocateSpace"], True):
                out.append({"storage": name, "type": s["type"], "content": s["content"], "shared": s["shared"]})
                out[-1] |= {"active": 1, "enabled": 1, "total": 1 << 42, "used": 1 << 40, "avail": 3 << 40}
        return out

    def ep_get_nodes_node_qemu(self, user, node, **_):
        out = []
        for vm in sorted(self.vms.values(), key=lambda v: v["vmid"]):
            if vm["node"] == node and self._audit(user, vm["vmid"]):
                r = self._resource(vm)
                out.append(
                    {k: r[k] for k in ("vmid", "name", "status", "maxmem", "uptime", "tags") if k in r}
                    | {"cpus": r["maxcpu"], "template": vm["template"]}
                )
        return out

    def ep_get_nodes_node_lxc(self, user, node, **_):
        return []

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

    # ---- power -----------------------------------------------------------------------------------
    def ep_post_nodes_node_qemu_vmid_status_start(self, user, node, vmid, **rest):
        for k in rest:
            raise self.not_simulated(f"the start parameter '{k}'")
        vm = self._vm(node, vmid)
        if vm["status"] == "running":
            return self._task(node, "qmstart", vm["vmid"], user, "VM already running")
        conf = self._effective(vm, current=False)  # vm_start applies the pending configuration first
        problem = self.start_problem(vm, conf)
        if problem:
            return self._task(node, "qmstart", vm["vmid"], user, problem.message, problem.log)
        vm["config"], vm["pending"], vm["pending_delete"] = conf, {}, []
        vm["status"], vm["pci_chosen"] = "running", vm.pop("_pci_next", [])
        if vm["agent_ip"] is None:
            self.next_ip += 1
            vm["agent_ip"] = f"192.0.2.{self.next_ip}"
        return self._task(node, "qmstart", vm["vmid"], user)

    def _stop(self, node, vmid, user, kind):
        vm = self._vm(node, vmid)
        vm["status"] = "stopped"
        vm.pop("pci_chosen", None)  # the stop ends the PCI reservation (PCI.pm remove_pci_reservation)
        return self._task(node, kind, vm["vmid"], user)

    def ep_post_nodes_node_qemu_vmid_status_stop(self, user, node, vmid, **_):
        return self._stop(node, vmid, user, "qmstop")

    def ep_post_nodes_node_qemu_vmid_status_shutdown(self, user, node, vmid, **_):
        return self._stop(node, vmid, user, "qmshutdown")

    # ---- snapshots -------------------------------------------------------------------------------
    def ep_get_nodes_node_qemu_vmid_snapshot(self, user, node, vmid, **_):
        vm = self._vm(node, vmid)
        running = int(vm["status"] == "running")
        current = {"name": "current", "digest": self._digest(vm["config"]), "running": running}
        current["description"] = "You are here!"
        if vm["snapshots"]:
            current["parent"] = vm["snapshots"][-1]["name"]
        return [dict(s) for s in vm["snapshots"]] + [current]

    def ep_post_nodes_node_qemu_vmid_snapshot(self, user, node, vmid, snapname, description=None, vmstate=None, **_):
        vm = self._vm(node, vmid)
        if any(s["name"] == snapname for s in vm["snapshots"]):
            raise ApiError(500, f"snapshot name '{snapname}' already used\n")
        if int(vmstate or 0) and any(re.match(r"^hostpci\d+$", k) for k in vm["config"]):
            return self._task(node, "qmsnapshot", vm["vmid"], user, "cannot snapshot VM state with PCI passthrough")
        snap = {"name": snapname, "description": description or "", "snaptime": int(time.time())}
        if vm["snapshots"]:
            snap["parent"] = vm["snapshots"][-1]["name"]
        vm["snapshots"].append(snap)
        return self._task(node, "qmsnapshot", vm["vmid"], user)

    # ---- guest agent, tasks ----------------------------------------------------------------------
    def ep_get_nodes_node_qemu_vmid_agent_network_get_interfaces(self, user, node, vmid, **_):
        vm = self._vm(node, vmid)
        if vm["config"].get("agent", "0").split(",")[0] not in ("1", "enabled=1"):
            raise ApiError(500, "No QEMU guest agent configured\n")
        if vm["status"] != "running":
            raise ApiError(500, f"VM {vmid} is not running\n")
        mac = "bc:24:11:00:%02x:%02x" % (vm["vmid"] >> 8 & 255, vm["vmid"] & 255)  # noqa: UP031
        lo = [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8}]
        eth = [
            {"ip-address": vm["agent_ip"], "ip-address-type": "ipv4", "prefix": 24},
            {"ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", "prefix": 64},
        ]
        return {
            "result": [
                {"name": "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": lo},
                {"name": "eth0", "hardware-address": mac, "ip-addresses": eth},
            ]
        }

    def _own_task(self, user: str, node: str, upid: str) -> dict:
        task = self.tasks.get(upid)
        if task is None:
            raise ApiError(500, f"unable to parse worker upid '{upid}'\n")
        if task["user"] != user:  # "needs 'Sys.Audit' on '/nodes/<node>' if they are not the owner of the task"
            self.perms.check(user, f"/nodes/{node}", ["Sys.Audit"])
        return task

    def ep_get_nodes_node_tasks_upid_status(self, user, node, upid, **_):
        return {k: v for k, v in self._own_task(user, node, upid).items() if k != "log"}

    def ep_get_nodes_node_tasks_upid_log(self, user, node, upid, **_):
        return [{"n": i + 1, "t": line} for i, line in enumerate(self._own_task(user, node, upid)["log"])]


class _Handler(BaseHTTPRequestHandler):
    sim: PveSim  # set on the subclass
    server_version = "pvesim/2 (simulated Proxmox VE API)"

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
            # PVE::APIServer::Formatter::Standard prepare_response_data (json): data, errors, message
            body = {"data": None, "message": e.message}
            if e.errors:
                body["errors"] = e.errors
            self._answer(e.code, body, reason=e.message.splitlines()[0] if e.message.strip() else None)

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
