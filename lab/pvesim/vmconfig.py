"""A VM's configuration in pvesim: clone, GET/PUT config, pending changes (qemu-server src/PVE/API2/Qemu.pm).

Line numbers: qemu-server 41ffc59e (9.1.19) src/PVE/API2/Qemu.pm ("QA") unless said otherwise.
- PUT config ($update_vm_api QA:2036-2222): no options at all dies (QA:2079); each `delete` entry must be a
  known option (QA:2113, 400 {"delete": "unknown option '<opt>'"}), not also set (QA:2103-2106); then
  $check_vm_modify_config_perm for the deleted and the set options (QA:2165-2167, perms.py) before anything is
  written. The update (QA:2223-2470) checks the digest, writes the deletes, then each set option in turn (Perl
  hash order; here sorted), checking hostpciN permissions (old and new value) as it reaches them: a refused
  hostpciN leaves the options written before it (QA:2333, 2443-2446).
- Running VM: options outside $fast_plug_option go to the pending section (QemuServer.pm vmconfig_hotplug_pending
  is not simulated: everything but fast-plug and cloud-init options waits for a stop and start).
- Clone (clone_vm QA:4307-4727, checks before the worker QA:4725): `storage` must allow VM images (QA:4435); with
  `target` on another node the storage must be shared, "can't clone to non-shared storage '<storage>'" (QA:4442),
  and every source volume on shared storage, "can't clone VM to node '<target>' (VM uses local storage)"
  (QA:4476); a linked clone takes no `storage` (QA:4460-4461); Datastore.AllocateSpace on the clone's storage and
  SDN.Use on each NIC's bridge (QA:4469-4472) for anyone but root@pam.
- PUT config, before any write: a new disk needs Datastore.AllocateSpace on its storage (QA:189), a balloon above the
  memory is refused (QA:2208-2217); in the update loop a disk needs VM.Config.Disk (QA:2242-2258).
"""

from __future__ import annotations

import hashlib
import json
import re
from urllib.parse import quote, unquote

from pvesim.formats import split_list
from pvesim.perms import DRIVE_RE

# qemu-server QemuServer.pm $fast_plug_option: applied at once even while the VM runs.
FAST_PLUG = {"name", "onboot", "shares", "vmstatestorage", "startup", "description", "protection", "tags", "hookscript"}
# Cloud-init values are read at the next start, but are not pending.
CLOUDINIT = {"ciuser", "cipassword", "sshkeys", "nameserver", "searchdomain", "citype"}
CLOUDINIT_RE = re.compile(r"^ipconfig\d+$")


class ConfigMixin:
    @staticmethod
    def _digest(conf: dict) -> str:
        return hashlib.sha1(json.dumps(conf, sort_keys=True).encode()).hexdigest()

    def _effective(self, vm: dict, current: bool) -> dict:
        conf = dict(vm["config"])
        if not current:
            conf.update(vm["pending"])
            for k in vm["pending_delete"]:
                conf.pop(k, None)
        return conf

    def _typed_config(self, conf: dict) -> dict:
        """Values typed as the answer schema types them (integers and booleans are JSON numbers)."""
        props = self.schema.answer_props("GET /nodes/{node}/qemu/{vmid}/config")
        out = {}
        for k, v in conf.items():
            t = props.get(k, {}).get("type", "string")
            out[k] = (float(v) if "." in str(v) else int(v)) if t in ("integer", "number", "boolean") else str(v)
        return out

    def ep_get_nodes_node_qemu_vmid_config(self, user, node, vmid, current=None, snapshot=None, **_):
        vm = self._vm(node, vmid)
        conf = self._effective(vm, current=bool(int(current or 0)))
        conf["digest"] = self._digest(vm["config"])
        return self._typed_config(conf)

    def ep_get_nodes_node_qemu_vmid_pending(self, user, node, vmid, **_):
        vm = self._vm(node, vmid)
        out = []
        for k in sorted(set(vm["config"]) | set(vm["pending"]) | set(vm["pending_delete"])):
            item = {"key": k}
            if k in vm["config"]:
                item["value"] = str(vm["config"][k])
            if k in vm["pending"]:
                item["pending"] = str(vm["pending"][k])
            if k in vm["pending_delete"]:
                item["delete"] = 1
            out.append(item)
        return out

    def _option_exists(self, opt: str) -> bool:
        """qemu-server PVE::QemuServer::option_exists: a key of the VM configuration schema."""
        return opt in self.schema.param_props("PUT /nodes/{node}/qemu/{vmid}/config") and opt not in (
            "node",
            "vmid",
            "delete",
            "digest",
            "revert",
            "skiplock",
            "force",
            "background_delay",
            "skip_cloud_init",
            "import-working-storage",
        )

    def ep_put_nodes_node_qemu_vmid_config(self, user, node, vmid, delete=None, digest=None, **params):
        vm = self._vm(node, vmid)
        if not delete and not params:
            raise self.api_error(500, "no options specified\n")
        for k in ("skiplock", "force", "background_delay", "revert", "skip_cloud_init", "import-working-storage"):
            if k in params:
                raise self.not_simulated(f"the PUT config parameter '{k}'")
        deletes = []
        for opt in split_list(delete or ""):  # QA:2097-2118
            opt = "ide2" if opt == "cdrom" else opt
            if opt in params:
                raise self.param_exc({"delete": f"you can't use '-{opt}' and -delete {opt}' at the same time"})
            if not self._option_exists(opt):
                raise self.param_exc({"delete": f"unknown option '{opt}'"})
            deletes.append(opt)
        self.perms.check_vm_modify_config(user, vm["vmid"], deletes)  # QA:2165
        self.perms.check_vm_modify_config(user, vm["vmid"], sorted(params))  # QA:2167
        self._check_storage_access(user, vm, params)  # QA:2169-2171
        if digest and digest != self._digest(vm["config"]):
            raise self.api_error(500, "detected modified configuration - file changed by other user? Try again.\n")
        self._check_balloon(vm, params)
        if "sshkeys" in params:
            params["sshkeys"] = quote(unquote(params["sshkeys"]), safe="")
        if "tags" in params:
            params["tags"] = ";".join(sorted({t for t in split_list(params["tags"])}))
        running = vm["status"] == "running"
        for k in deletes:
            val = vm["config"].get(k, vm["pending"].get(k))
            if val is None:
                continue  # "cannot delete '<opt>' - not set in current configuration!" (a warning)
            if k.startswith("hostpci"):
                self._hostpci_perm(user, vm, k, val)
            if not running or k in FAST_PLUG or k in CLOUDINIT or CLOUDINIT_RE.match(k):
                vm["config"].pop(k, None)
                vm["pending"].pop(k, None)
            else:
                vm["pending"].pop(k, None)
                if k in vm["config"] and k not in vm["pending_delete"]:
                    vm["pending_delete"].append(k)
        for k in sorted(params):
            v = params[k]
            if DRIVE_RE.match(k):
                self._check_drive_perms(user, vm, k, v)
            if k.startswith("hostpci"):
                if vm["config"].get(k):
                    self._hostpci_perm(user, vm, k, vm["config"][k])
                self._hostpci_perm(user, vm, k, v)
            if k == "efidisk0":
                v = self._allocate_efidisk(vm, v)
            if not running or k in FAST_PLUG or k in CLOUDINIT or CLOUDINIT_RE.match(k):
                vm["config"][k] = v
                vm["pending"].pop(k, None)
            else:
                vm["pending"][k] = v
            if k in vm["pending_delete"]:
                vm["pending_delete"].remove(k)
        # PVE::QemuConfig->cleanup_pending: pending values equal to the current ones are dropped
        for k in [k for k, v in vm["pending"].items() if str(vm["config"].get(k)) == str(v)]:
            del vm["pending"][k]
        return None

    def _check_storage_access(self, user: str, vm: dict, params: dict) -> None:
        """$check_storage_access (QA:163-259, 8.4 :154-264) for the drives set: a new disk `STORAGE:SIZE`
        (Drive.pm $NEW_DISK_RE) needs Datastore.AllocateSpace on /storage/<id> (QA:189, 8.4 :180) and a storage that
        holds images, else 400 {"storage": "storage '<id>' does not support vm images"} (QA:191-192)."""
        for k in sorted(params):
            m = re.match(r"^(?:([^/:\s]+):)?(\d+(?:\.\d+)?)$", str(params[k]).split(",", 1)[0])
            if not DRIVE_RE.match(k) or not m or "media=cdrom" in str(params[k]):
                continue
            if not m[1]:
                raise self.not_simulated("a new disk without a storage (the default storage)")
            self.perms.check(user, f"/storage/{m[1]}", ["Datastore.AllocateSpace"])
            stores = self._storages(vm["node"])
            if m[1] in stores and "images" not in stores[m[1]]["content"].split(","):
                raise self.param_exc({"storage": f"storage '{m[1]}' does not support vm images"})

    def _check_drive_perms(self, user: str, vm: dict, opt: str, value: str) -> None:
        """The update loop's check_drive_perms (QA:2242-2258, 8.4 :2174-2189): a cloud-init drive needs
        VM.Config.Cloudinit or VM.Config.CDROM, a CD-ROM VM.Config.CDROM, any other disk VM.Config.Disk."""
        if "cloudinit" in str(value):
            self.perms.check(user, f"/vms/{vm['vmid']}", ["VM.Config.Cloudinit", "VM.Config.CDROM"], any_=True)
        elif "media=cdrom" in str(value):
            self.perms.check(user, f"/vms/{vm['vmid']}", ["VM.Config.CDROM"])
        else:
            self.perms.check(user, f"/vms/{vm['vmid']}", ["VM.Config.Disk"])

    def _check_balloon(self, vm: dict, params: dict) -> None:
        """QA:2208-2217 (8.4 :2143-2153), before any write: with memory or balloon set, a balloon above the memory
        (its `current`, Memory.pm get_current_memory; default 512) dies "balloon value too large (must be smaller
        than assigned memory)"."""
        if not (params.get("memory") or "balloon" in params):
            return
        memory = params.get("memory") or vm["pending"].get("memory") or vm["config"].get("memory") or "512"
        maxmem = int(str(memory).split(",")[0].replace("current=", ""))
        balloon = params.get("balloon", vm["pending"].get("balloon") or vm["config"].get("balloon"))
        if balloon and int(balloon) > maxmem:
            raise self.api_error(500, "balloon value too large (must be smaller than assigned memory)\n")

    def _hostpci_perm(self, user: str, vm: dict, opt: str, value: str) -> None:
        parsed = {}
        for part in str(value).split(","):
            k, _, v = part.partition("=")
            parsed.update({k: v} if v else {"host": k})
        self.perms.check_hostpci(user, vm["vmid"], opt, parsed)

    def _allocate_efidisk(self, vm: dict, value: str) -> str:
        m = re.match(r"^([\w\-.]+):(\d+)(,.*)?$", value)
        if not m:  # an existing volume
            return value
        if m[1] not in self._storages(vm["node"]):
            raise self.api_error(500, f"storage '{m[1]}' does not exist\n")
        n = sum(1 for v in vm["config"].values() if isinstance(v, str) and f"vm-{vm['vmid']}-disk-" in v)
        return f"{m[1]}:vm-{vm['vmid']}-disk-{n}{m[3] or ''},size=4M"

    # ---- clone -----------------------------------------------------------------------------------
    def _volumes(self, conf: dict) -> list[tuple[str, str]]:
        out = []
        for k, v in conf.items():
            if re.match(r"^(?:scsi|virtio|sata|ide|efidisk|tpmstate)\d+$", k) and ":" in str(v):
                out.append((k, str(v).split(":", 1)[0]))
        return out

    def ep_post_nodes_node_qemu_vmid_clone(
        self, user, node, vmid, newid, name=None, full=None, storage=None, target=None, **rest
    ):
        for k in rest:
            raise self.not_simulated(f"the clone parameter '{k}'")
        src = self._vm(node, vmid)
        newid = int(newid)
        target = None if target in (None, node, "localhost") else target
        if target and target not in self.nodes:
            raise self.api_error(500, f"no such cluster node '{target}'\n")
        stores = self._storages(node)
        if storage:
            if storage not in stores:
                raise self.api_error(500, f"storage '{storage}' does not exist\n")
            if "images" not in stores[storage]["content"].split(","):
                raise self.param_exc({"storage": f"storage '{storage}' does not support vm images"})
            if target and not stores[storage]["shared"]:
                raise self.api_error(500, f"can't clone to non-shared storage '{storage}'\n")
        if src["status"] == "running" and not src["template"]:
            raise self.api_error(500, "cannot clone a running VM without snapshot\n")  # not simulated: live clones
        full_clone = bool(int(full)) if full is not None else not src["template"]
        if storage and not full_clone:
            raise self.api_error(500, "parameter 'storage' not allowed for linked clones\n")
        # $check_storage_access_clone (QA:261-302 / 8.4 :273-314, called QA:4469 / :4371): each disk that is no
        # CD-ROM needs Datastore.AllocateSpace on the clone's storage (`storage`, else its own) (QA:293 / :305);
        # check_bridge_access (QA:4472 / :4374, QemuServer.pm :6399-6412 / :7000) -> pve-guest-common
        # GuestHelpers.pm check_vnet_access (6.0.2 7353101 :397-421 / 5.2.2 58ad183 :393-417): SDN.Use on
        # /sdn/zones/<zone>/<bridge> per NIC, /<tag> with a VLAN tag (zone `localnetwork`: no SDN vnets simulated)
        if user != "root@pam":
            for k, store in self._volumes(src["config"]):
                if "media=cdrom" not in str(src["config"][k]):
                    self.perms.check(user, f"/storage/{storage or store}", ["Datastore.AllocateSpace"])
            for k, v in sorted(src["config"].items()):
                fields = dict(kv.split("=", 1) for kv in str(v).split(",") if "=" in kv)
                if re.match(r"^net\d+$", k) and fields.get("bridge"):
                    if fields.get("trunks"):
                        raise self.not_simulated("check_vnet_access for trunks")
                    tag = f"/{fields['tag']}" if fields.get("tag") else ""
                    self.perms.check(user, f"/sdn/zones/localnetwork/{fields['bridge']}{tag}", ["SDN.Use"])
        shared = all(stores.get(s, {}).get("shared") for _, s in self._volumes(src["config"]))
        if target and not shared:
            raise self.api_error(500, f"can't clone VM to node '{target}' (VM uses local storage)\n")
        if newid in self.vms:
            raise self.api_error(500, f"unable to create VM {newid}: config file already exists\n")
        conf = dict(src["config"])
        conf.pop("template", None)
        for k, v in list(conf.items()):
            m = re.match(r"^(?:scsi|virtio|sata|ide|efidisk|tpmstate)\d+$", k)
            if m and ("media=cdrom" not in v or "cloudinit" in v):  # cloud-init drives are cloned too
                store, rest_ = v.split(":", 1)
                rest_ = re.sub(r"^(?:base-\d+-disk-(\d+)/)?(?:vm|base)-\d+-disk-(\d+)", rf"vm-{newid}-disk-\2", rest_)
                rest_ = re.sub(r"^(?:vm|base)-\d+-cloudinit", f"vm-{newid}-cloudinit", rest_)
                conf[k] = f"{storage or store}:{rest_}"
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
        self.vms[newid] = self._new_vm(newid, target or node, conf)
        return self._task(node, "qmclone", int(vmid), user)

    @staticmethod
    def _new_vm(vmid: int, node: str, conf: dict, status: str = "stopped", template: int = 0, agent_ip=None) -> dict:
        return {
            "vmid": vmid,
            "node": node,
            "status": status,
            "template": template,
            "config": conf,
            "pending": {},
            "pending_delete": [],
            "snapshots": [],
            "agent_ip": agent_ip,
        }
