"""Who may do what in pvesim: users, API tokens, ACLs, and qemu-server's root-only configuration options.

Sources (line numbers at these commits):
  pve-access-control 5ccd07d src/PVE/RPCEnvironment.pm        = AC
  qemu-server 41ffc59e (9.1.19) src/PVE/API2/Qemu.pm           = QA   (8.4.10 5ccd363e: same code; lines in README)
  pve-manager 14a22df3 PVE/HTTPServer.pm                       = HS

- The authenticated id of an API token request is the token id `user@realm!name` (HS:85-113, "the token-ID
  `<user>@<realm>!<tokenname>` is the user for token based authentication"), so a token of root@pam is not
  'root@pam' for the root-only checks below, whatever its privileges.
- Privileges (AC:136-176 permissions): root@pam has all; a token without privilege separation has its user's,
  with privilege separation the intersection of its own ACL and its user's; ACLs propagate to sub-paths and a
  deeper entry replaces what is inherited (pve-access-control AccessControl.pm roles()). An ACL here is
  {path: [privilege, ...]} (privileges directly, no roles).
- A method's `permissions` from the schema (check: perm/and/or) are checked before it runs (HS:173-174
  check_api2_permissions); failures are HTTP 403 "Permission check failed (<path>, <priv>)" (pve-common
  Exception.pm:53-70 raise_perm_exc).
- PUT config: $check_vm_modify_config_perm (QA:967-1014) for the deleted and the set options; options in no
  privilege class (`args`, `hugepages`, `hookscript`, ...) die "only root can set '<opt>' config" (QA:1009),
  HTTP 500, before anything is written. hostpciN: check_hostpci_perm (QA:894-910): a raw bus id (`host`)
  dies "only root can set '<opt>' config for non-mapped devices" (QA:901); `mapping=` needs Mapping.Use on
  /mapping/pci/<id> and VM.Config.HWType (QA:903-904).
"""

from __future__ import annotations

import re

ROOT = "root@pam"

# Every privilege of the release (the Administrator role, what root@pam has): pve-access-control
# src/PVE/AccessControl.pm $privgroups + $valid_privs, 9.1: 5ccd07d (9.1.1) :1057-1168, 8.4: stable-bookworm 0f258e7
# (8.2.3) :1057-1164. Proxmox VE 9 split VM.Monitor into VM.GuestAgent.* (and added VM.Replicate).
_COMMON_PRIVS = [
    "Datastore.Allocate",
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
    "Group.Allocate",
    "Mapping.Audit",
    "Mapping.Modify",
    "Mapping.Use",
    "Permissions.Modify",
    "Pool.Allocate",
    "Pool.Audit",
    "Realm.Allocate",
    "Realm.AllocateUser",
    "SDN.Allocate",
    "SDN.Audit",
    "SDN.Use",
    "Sys.AccessNetwork",
    "Sys.Audit",
    "Sys.Console",
    "Sys.Incoming",
    "Sys.Modify",
    "Sys.PowerMgmt",
    "Sys.Syslog",
    "User.Modify",
    "VM.Allocate",
    "VM.Audit",
    "VM.Backup",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Cloudinit",
    "VM.Config.Disk",
    "VM.Config.HWType",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.Console",
    "VM.Migrate",
    "VM.PowerMgmt",
    "VM.Snapshot",
    "VM.Snapshot.Rollback",
]
ALL_PRIVS = {
    "8.4": sorted([*_COMMON_PRIVS, "VM.Monitor"]),
    "9.1": sorted(
        [*_COMMON_PRIVS, "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead", "VM.GuestAgent.FileSystemMgmt"]
        + ["VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted", "VM.Replicate"]
    ),
}

# QA:765-838: the privilege each option class needs (everything else is root only).
CPU_OPTIONS = {"cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus"}
MEMORY_OPTIONS = {"memory", "balloon", "shares", "allow-ksm"}  # 8.4: without allow-ksm
HWTYPE_OPTIONS = {"acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga"}
HWTYPE_OPTIONS |= {"watchdog", "audio0", "rng0"}
GENERAL_OPTIONS = {"agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime"}
GENERAL_OPTIONS |= {"migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate", "startup"}
GENERAL_OPTIONS |= {"tdf", "template"}
DISK_OPTIONS = {"boot", "bootdisk", "vmstatestorage"}
CLOUDINIT_OPTIONS = {"cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys"}
DRIVE_RE = re.compile(r"^(?:ide|sata|scsi|virtio|efidisk|tpmstate)\d+$")  # QemuServer/Drive.pm is_valid_drivename


class PermError(Exception):
    def __init__(self, code: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.code, self.message, self.errors = code, message, errors


def perm_exc(what: str = "") -> PermError:
    return PermError(403, "Permission check failed" + (f" ({what})" if what else "") + "\n")


class Perms:
    def __init__(self, users: dict, tokens: dict):
        # users: "user@realm" -> password or {"password", "acl"}; tokens: "user@realm!name" -> secret or
        # {"secret", "privsep", "acl"} (a plain secret: no privilege separation, like `pveum user token add`
        # with --privsep 0)
        norm = lambda v, key: v if isinstance(v, dict) else {key: v}  # noqa: E731
        self.users = {u: {"acl": {}, **norm(v, "password")} for u, v in users.items()}
        self.tokens = {t: {"privsep": 0, "acl": {}, **norm(v, "secret")} for t, v in tokens.items()}

    @staticmethod
    def _acl_privs(acl: dict, path: str) -> set:
        best = None
        for p in acl:
            covers = path == p or p == "/" or path.startswith(p.rstrip("/") + "/")
            if covers and (best is None or len(p) > len(best)):
                best = p
        return set(acl[best]) if best is not None else set()

    def privs(self, authid: str, path: str) -> set | None:
        """The privileges of `authid` on `path`; None means all (root@pam)."""
        if authid == ROOT:
            return None
        if "!" in authid:
            user = authid.split("!", 1)[0]
            token = self.tokens[authid]
            user_privs = self.privs(user, path)
            if not token["privsep"]:
                return user_privs
            own = self._acl_privs(token["acl"], path)
            return own if user_privs is None else own & user_privs
        return self._acl_privs(self.users.get(authid, {}).get("acl", {}), path)

    def has(self, authid: str, path: str, privs: list[str], any_: bool = False) -> bool:
        have = self.privs(authid, path)
        if have is None:
            return True
        return any(p in have for p in privs) if any_ else all(p in have for p in privs)

    def check(self, authid: str, path: str, privs: list[str], any_: bool = False) -> None:
        """AC:291-326 check / check_any."""
        if self.has(authid, path, privs, any_):
            return
        missing = privs if any_ else [p for p in privs if p not in (self.privs(authid, path) or set())][:1]
        raise perm_exc(f"{path}, {'|'.join(missing)}")

    def check_api(self, authid: str, permissions: dict, params: dict) -> None:
        """The method's `permissions` (schema): perm / and / or; 'user': 'all' or 'world' needs no privilege."""
        check = permissions.get("check")
        if check and not self._eval(authid, check, params):
            raise perm_exc()

    def _eval(self, authid: str, check: list, params: dict) -> bool:
        op = check[0]
        if op == "and":
            return all(self._eval(authid, c, params) for c in check[1:])
        if op == "or":
            return any(self._eval(authid, c, params) for c in check[1:])
        if op == "perm":
            _, path, privs, *rest = check
            opts = dict(zip(rest[::2], rest[1::2], strict=False))
            if "require_param" in opts and opts["require_param"] not in params:
                return False
            path = re.sub(r"\{(\w+)\}", lambda m: str(params.get(m[1], "")), path)
            return self.has(authid, path, privs, any_=bool(opts.get("any")))
        raise PermError(501, f"pvesim does not simulate the permission check '{op}'\n")

    # ---- qemu-server: PUT /nodes/{node}/qemu/{vmid}/config --------------------------------------
    def check_vm_modify_config(self, authid: str, vmid: int, keys: list[str]) -> None:
        """QA:967-1014 $check_vm_modify_config_perm."""
        if authid == ROOT:
            return
        vm_path = f"/vms/{vmid}"
        for opt in keys:
            if DRIVE_RE.match(opt) or opt == "cdrom" or opt == "tags":
                continue
            if re.match(r"^(?:unused|serial|usb|hostpci|virtiofs)\d+$", opt):
                continue
            if opt in CPU_OPTIONS or re.match(r"^numa\d+$", opt):
                self.check(authid, vm_path, ["VM.Config.CPU"])
            elif opt in MEMORY_OPTIONS:
                self.check(authid, vm_path, ["VM.Config.Memory"])
            elif opt in HWTYPE_OPTIONS:
                self.check(authid, vm_path, ["VM.Config.HWType"])
            elif opt in GENERAL_OPTIONS:
                self.check(authid, vm_path, ["VM.Config.Options"])
            elif opt == "freeze":
                self.check(authid, vm_path, ["VM.PowerMgmt"])
            elif opt in DISK_OPTIONS:
                self.check(authid, vm_path, ["VM.Config.Disk"])
            elif re.match(r"^net\d+$", opt):
                self.check(authid, vm_path, ["VM.Config.Network"])
            elif opt in CLOUDINIT_OPTIONS or re.match(r"^ipconfig\d+$", opt):
                self.check(authid, vm_path, ["VM.Config.Cloudinit", "VM.Config.Network"], any_=True)
            elif opt == "vmstate":
                self.check(authid, vm_path, ["VM.Config.Disk", "VM.PowerMgmt"])
            else:  # "catches args, lock, etc." (QA:1007)
                raise PermError(500, f"only root can set '{opt}' config\n")

    def check_hostpci(self, authid: str, vmid: int, opt: str, parsed: dict) -> None:
        """QA:894-910 check_hostpci_perm (parsed: the property string of the hostpci value)."""
        if authid == ROOT:
            return
        if parsed.get("host"):
            raise PermError(500, f"only root can set '{opt}' config for non-mapped devices\n")
        if parsed.get("mapping"):
            self.check(authid, f"/mapping/pci/{parsed['mapping']}", ["Mapping.Use"])
            self.check(authid, f"/vms/{vmid}", ["VM.Config.HWType"])
        else:
            raise PermError(500, "either 'host' or 'mapping' must be set.\n")
