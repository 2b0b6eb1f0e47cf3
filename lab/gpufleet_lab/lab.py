"""Bring a lab of systemd-nspawn "GPU VMs" up and down, idempotently, recovering from killed labs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet_lab import cgroups, network
from gpufleet_lab.base import DEFAULT_MIRROR, ensure_base
from gpufleet_lab.equipment import install_equipment
from gpufleet_lab.sysutil import (
    LabError,
    kill_recorded,
    mounted_under,
    pid_is,
    pids_in_netns,
    port_open,
    proc_starttime,
    run,
    write_atomic,
)

STATE_ROOT = Path(os.environ.get("GPUFLEET_LAB_STATE", "/var/lib/gpufleet-lab"))
CACHE_DIR = Path(os.environ.get("GPUFLEET_LAB_CACHE", "/var/cache/gpufleet-lab"))
DEFAULT_NAME = "gpufleet"
DEFAULT_SUBNET = "10.123.0.0/24"
DEFAULT_PROFILE = "rtx-pro-6000x8-vm"
# How long `systemctl is-system-running` in a host may take before the host counts as unresponsive.
SYSTEMCTL_TIMEOUT = 20
READY_TIMEOUT = 180.0
LAB_PACKAGE_PARENT = Path(__file__).resolve().parent.parent  # what PYTHONPATH needs for gpufleet_lab


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _pid_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except (FileNotFoundError, ProcessLookupError):
        return None


def boot_pids(supervisor_pid: int) -> tuple[int | None, int | None]:
    """(systemd-nspawn, container init) of a host's current boot: nspawn is the supervisor's child (a new one
    after each reboot, supervise.py); the init is nspawn's child in a new PID namespace (nspawn first forks
    an intermediate child that exits once the init exists, so the first child seen is not necessarily it)."""
    own = _pid_namespace(supervisor_pid)
    for nspawn in _children(supervisor_pid):
        for child in _children(nspawn):
            namespace = _pid_namespace(child)
            if namespace is not None and namespace != own:
                return nspawn, child
        return nspawn, None
    return None, None


def host_running(record: dict) -> bool:
    """The host's supervisor lives (between two boots of a reboot there is no nspawn, but the host is on).
    Records written before there was a supervisor: their nspawn."""
    if record.get("supervisor_pid"):
        return pid_is(record["supervisor_pid"], record.get("supervisor_starttime"))
    return pid_is(record.get("nspawn_pid"), record.get("nspawn_starttime"))


def current_boot(record: dict) -> dict:
    """The record with the nspawn and init of the host's current boot (they change when the host reboots;
    the state file keeps those of the first boot). None for both while the host is off or between boots."""
    if not record.get("supervisor_pid"):
        return record
    if pid_is(record.get("leader_pid"), record.get("leader_starttime")) and pid_is(
        record.get("nspawn_pid"), record.get("nspawn_starttime")
    ):
        return record
    nspawn, leader = boot_pids(record["supervisor_pid"]) if host_running(record) else (None, None)
    return {
        **record,
        "nspawn_pid": nspawn,
        "nspawn_starttime": proc_starttime(nspawn) if nspawn else None,
        "leader_pid": leader,
        "leader_starttime": proc_starttime(leader) if leader else None,
    }


@dataclass
class LabSpec:
    name: str = DEFAULT_NAME
    hosts: int = 2
    subnet: str | None = None
    profiles: list[str] = field(default_factory=lambda: [DEFAULT_PROFILE])
    mirror: str = DEFAULT_MIRROR
    host_names: list[str] | None = None

    def profile_for(self, index: int) -> str:
        """Profile of host number index (1-based); the last listed profile repeats."""
        return self.profiles[min(index, len(self.profiles)) - 1]


def short_id(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:6]


def subnet_candidates(name: str, count: int = 64) -> list[ipaddress.IPv4Network]:
    """Subnets a lab other than the default one tries, in order: a stable /24 in 10.200-10.254 derived
    from its name, then the next ones (different names can start on the same /24)."""
    seed = int(short_id(name), 16)
    return [
        ipaddress.ip_network(f"10.{200 + (seed + attempt) % 55}.{(seed // 55 + attempt) % 256}.0/24")
        for attempt in range(count)
    ]


def validate_name(name: str) -> None:
    if not name or len(name) > 40 or not all(c.isalnum() or c == "-" for c in name) or name[0] == "-":
        raise LabError(f"lab name {name!r} is invalid: use letters, digits and '-', at most 40 characters")


class Lab:
    """One lab: its state file, hosts, bridge, subnet and NAT rules."""

    def __init__(self, name: str = DEFAULT_NAME, log=print):
        validate_name(name)
        self.name = name
        self.log = log
        self.dir = STATE_ROOT / name
        self.state_file = self.dir / "state.json"
        self.bridge = f"gfl-{short_id(name)}"
        self.nat_comment = f"gpufleet-lab:{name}"
        self.key_file = self.dir / "id_ed25519"

    # ----- state ---------------------------------------------------------------------------------
    def load(self) -> dict:
        if self.state_file.exists():
            return json.loads(self.state_file.read_text())
        return {"name": self.name, "hosts": {}}

    def save(self, state: dict) -> None:
        write_atomic(self.state_file, json.dumps(state, indent=2, sort_keys=True) + "\n")

    def host_names(self, count: int, names: list[str] | None = None) -> list[str]:
        """Host names: given ones (e.g. Molecule platform names) or <lab>-01, <lab>-02, ..."""
        if names:
            if len(names) != count or len(set(names)) != count:
                raise LabError(f"--host-names needs {count} distinct names, got {names}")
            for name in names:
                validate_name(name)
            return names
        return [f"{self.name}-{i:02d}" for i in range(1, count + 1)]

    # ----- up ------------------------------------------------------------------------------------
    def up(self, spec: LabSpec) -> dict:
        """Make the lab match spec; returns a summary with what changed. The lab's folder stays locked while it
        runs (busy): until its first host is recorded, a lab being brought up has state and no live host, and
        `prune` in another process must not take it for a stale one."""
        base = ensure_base(CACHE_DIR, spec.mirror, log=self.log)
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._dir_locked():
            return self._up(spec, base)

    @contextlib.contextmanager
    def _dir_locked(self, wait: bool = True):
        """flock on the lab's folder (held by `up` and `down`); yields True when taken, False when wait is off and
        another process holds it, None when there is no folder."""
        try:
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            yield None
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def busy(self) -> bool:
        """Another process is bringing the lab up or down (it holds the folder's lock)."""
        with self._dir_locked(wait=False) as got:
            return got is False

    def _up(self, spec: LabSpec, base: Path) -> dict:
        state = self.load()
        with network.network_lock():
            # Under the lock: another lab's `up` must see this subnet routed before it picks one.
            subnet = ipaddress.ip_network(spec.subnet or state.get("subnet") or self._pick_subnet())
            if state.get("subnet") and str(subnet) != state["subnet"]:
                raise LabError(
                    f"lab {self.name!r} already runs on {state['subnet']}; run 'down' first to move it to {subnet}"
                )
            if subnet.prefixlen > 28 or subnet.num_addresses - 3 < spec.hosts:
                raise LabError(f"subnet {subnet} has too few addresses for {spec.hosts} hosts")
            network.check_subnet_free(subnet, self.bridge)
            state.update(name=self.name, subnet=str(subnet), bridge=self.bridge, mirror=spec.mirror)
            self.save(state)
            gateway = str(next(subnet.hosts()))
            bridge_changed = network.ensure_bridge(self.bridge, f"{gateway}/{subnet.prefixlen}")
            nat_changed = network.ensure_nat(str(subnet), self.bridge, self.nat_comment)
            # <hierarchy>/gpufleet-lab/<lab>: under the lock, as another lab's `down` removes an empty
            # <hierarchy>/gpufleet-lab under it.
            cgroups.create(cgroups.lab_dirs(self.name))
        self._ensure_key()

        wanted = self.host_names(spec.hosts, spec.host_names)
        addresses = list(subnet.hosts())[1 : spec.hosts + 1]
        hosts_file = self._hosts_file(wanted, addresses)
        started, unchanged, removed = [], [], []
        # Hosts beyond the requested count go away first (declarative size).
        for name in sorted(set(state["hosts"]) - set(wanted)):
            self._destroy_host(state["hosts"].pop(name))
            removed.append(name)
            self.save(state)
        for index, (name, addr) in enumerate(zip(wanted, addresses, strict=True), start=1):
            profile = spec.profile_for(index)
            record = state["hosts"].get(name)
            healthy = record is not None and self._host_alive(record)
            if healthy and record.get("profile") == profile and record.get("address") == str(addr):
                unchanged.append(name)
                self._write_hosts_file(Path(record["root"]), hosts_file)
                continue
            if record is not None:
                self.log(f"{name}: {'replacing' if healthy else 'recovering stale host'}")
                self._destroy_host(record)
            record = self._create_host(name, index, str(addr), subnet, gateway, base, profile, hosts_file)
            state["hosts"][name] = record
            self.save(state)
            started.append(name)
        for name in started:
            self._wait_ready(state["hosts"][name])
        changed = bool(started or removed or bridge_changed or nat_changed)
        return {
            "lab": self.name,
            "changed": changed,
            "started": started,
            "unchanged": unchanged,
            "removed": removed,
            "hosts": self.instances(state),
        }

    def _pick_subnet(self) -> str:
        """A free subnet for the lab; called under network.network_lock() (see up)."""
        if self.name == DEFAULT_NAME:
            return DEFAULT_SUBNET
        for candidate in subnet_candidates(self.name):
            if network.subnet_is_free(candidate, self.bridge):
                return str(candidate)
        raise LabError("no free /24 found for the lab in 10.200.0.0-10.254.255.0: pass --subnet")

    def _ensure_key(self) -> None:
        if not self.key_file.exists():
            run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    f"gpufleet-lab-{self.name}",
                    "-f",
                    str(self.key_file),
                ]
            )

    def _hosts_file(self, names: list[str], addresses: list) -> str:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", ""]
        lines += [f"{addr}\t{name}" for name, addr in zip(names, addresses, strict=True)]
        return "\n".join(lines) + "\n"

    @staticmethod
    def _write_hosts_file(root: Path, text: str) -> None:
        target = root / "etc/hosts"
        if not target.exists() or target.read_text() != text:
            write_atomic(target, text)

    def _create_host(self, name, index, address, subnet, gateway, base, profile, hosts_file) -> dict:
        hdir = self.dir / "hosts" / name
        upper, work, root = hdir / "upper", hdir / "work", hdir / "root"
        for d in (upper, work, root):
            d.mkdir(parents=True, exist_ok=True)
        run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={base},upperdir={upper},workdir={work}",
                str(root),
            ]
        )
        record = {
            "name": name,
            "index": index,
            "address": address,
            "profile": profile,
            "root": str(root),
            "dir": str(hdir),
            # Namespaces are named after the lab, not the host, so labs with equal host names coexist.
            "netns": f"{self.name}-{index:02d}",
            "veth": f"gfv-{short_id(self.name)}-{index:02d}"[:15],
        }
        (root / "etc/hostname").write_text(name + "\n")
        self._write_hosts_file(root, hosts_file)
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(f"{self.key_file}.pub", ssh_dir / "authorized_keys")
        os.chmod(ssh_dir / "authorized_keys", 0o600)
        # One ed25519 host key per host (RSA generation would cost a second per host).
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "etc/ssh/ssh_host_ed25519_key")])
        (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
        (root / "etc/ssh/sshd_config.d/gpufleet-lab.conf").write_text("HostKey /etc/ssh/ssh_host_ed25519_key\n")
        install_equipment(root, profile)
        network.create_host_link(record["netns"], record["veth"], self.bridge, f"{address}/{subnet.prefixlen}", gateway)
        # The host's own cgroup subtree (see cgroups.py): nspawn starts inside it, so the container's
        # systemd gets a cgroup tree that holds this host's processes only and can kill a unit's cgroup.
        cgroup_dirs = cgroups.host_dirs(self.name, name)
        record["cgroups"] = [str(d) for d in cgroup_dirs]
        cgroups.remove(cgroup_dirs)  # a leftover of a killed run of this host
        cgroups.create(cgroup_dirs)
        log = open(hdir / "nspawn.log", "ab")  # noqa: SIM115 - handed to the long-lived child
        # nspawn runs under the host's supervisor (supervise.py), which boots the host again when it reboots
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet_lab.supervise",
                "systemd-nspawn",
                "-q",
                "-b",
                "-D",
                str(root),
                "-M",
                name,
                "--register=no",
                "--keep-unit",
                "--console=passive",
                f"--network-namespace-path=/run/netns/{record['netns']}",
                "--resolv-conf=copy-host",
                f"--uuid={uuid.uuid4()}",
                f"--hostname={name}",
                # root of a VM may change its own network's firewall (fleet_firewall's nftables table); the host has
                # a network namespace of its own, so nothing outside it is reachable by this capability
                "--capability=CAP_NET_ADMIN",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: cgroups.enter(cgroup_dirs),  # the lab tool runs no threads
            env={**os.environ, "PYTHONPATH": str(LAB_PACKAGE_PARENT)},
        )
        log.close()
        record["supervisor_pid"] = proc.pid
        record["supervisor_starttime"] = proc_starttime(proc.pid)
        nspawn, leader = self._wait_first_boot(proc)
        record["nspawn_pid"] = nspawn
        record["nspawn_starttime"] = proc_starttime(nspawn)
        record["leader_pid"] = leader
        record["leader_starttime"] = proc_starttime(leader)
        return record

    @staticmethod
    def _wait_first_boot(proc: subprocess.Popen) -> tuple[int, int]:
        """nspawn and the container's init of the first boot, under the supervisor proc."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LabError(f"systemd-nspawn exited with {proc.returncode} before booting the host")
            nspawn, leader = boot_pids(proc.pid)
            if leader:
                return nspawn, leader
            time.sleep(0.02)
        raise LabError("systemd-nspawn started no container within 20 s")

    def _host_alive(self, record: dict) -> bool:
        record = current_boot(record)
        if not (
            host_running(record)
            and pid_is(record.get("nspawn_pid"), record.get("nspawn_starttime"))
            and pid_is(record.get("leader_pid"), record.get("leader_starttime"))
        ):
            return False
        return self._system_state(record) in ("running", "degraded")

    @staticmethod
    def _system_state(record: dict) -> str:
        record = current_boot(record)
        if not record.get("leader_pid"):
            return "rebooting" if host_running(record) else "stopped"
        try:
            proc = subprocess.run(
                ["nsenter", "-t", str(record["leader_pid"]), "-a", "systemctl", "is-system-running"],
                capture_output=True,
                text=True,
                check=False,
                timeout=SYSTEMCTL_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            # Seen while a host's systemd goes down for a reboot: its manager socket still accepts and never
            # answers. Like a VM whose guest agent stops answering: alive to the hypervisor, not ready.
            return "unresponsive"
        return proc.stdout.strip() or proc.stderr.strip()

    def _wait_ready(self, record: dict) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        state = "unknown"
        while time.monotonic() < deadline:
            if not host_running(record):
                tail = Path(record["dir"], "nspawn.log").read_text(errors="replace")[-2000:]
                raise LabError(f"{record['name']}: systemd-nspawn exited during boot:\n{tail}")
            state = self._system_state(record)
            if state in ("running", "degraded") and port_open(record["address"], 22):
                return
            time.sleep(0.1)
        raise LabError(f"{record['name']}: not ready after {READY_TIMEOUT:.0f} s (is-system-running: {state})")

    # ----- down ----------------------------------------------------------------------------------
    def _destroy_host(self, record: dict) -> None:
        boot = current_boot(record)  # found through the supervisor, so before it goes
        # SIGTERM to the supervisor: it passes it on to nspawn and boots nothing again
        kill_recorded(record.get("supervisor_pid"), record.get("supervisor_starttime"))
        kill_recorded(boot.get("nspawn_pid"), boot.get("nspawn_starttime"))
        kill_recorded(boot.get("leader_pid"), boot.get("leader_starttime"), timeout=3)
        # A container whose nspawn was SIGKILLed leaves its payload running in the host's netns:
        # end every process in that namespace (found by namespace identity, not by name).
        netns_path = f"/run/netns/{record['netns']}"
        for _ in range(50):
            pids = [p for p in pids_in_netns(netns_path) if p != os.getpid()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            time.sleep(0.1)
        # Whatever is left in the host's cgroup subtree (recorded, or named after lab and host for a
        # record written before there was one), then the subtree itself.
        if record.get("name"):
            dirs = {Path(d) for d in record.get("cgroups", [])} | set(cgroups.host_dirs(self.name, record["name"]))
            cgroups.remove(sorted(dirs))
        for point in mounted_under(Path(record["dir"])):
            if run(["umount", point], check=False).returncode != 0:
                run(["umount", "-l", point])
        network.delete_host_link(record["netns"], record["veth"])
        shutil.rmtree(record["dir"], ignore_errors=True)

    def down(self) -> dict:
        """Take the lab down; its folder stays locked meanwhile (busy), so a `prune` in another process leaves it."""
        with self._dir_locked():
            return self._down()

    def _down(self) -> dict:
        state = self.load()
        removed = []
        for name, record in sorted(state.get("hosts", {}).items()):
            self._destroy_host(record)
            removed.append(name)
        # Anything left by an older or broken run, found by this lab's naming and mount locations.
        for point in mounted_under(self.dir):
            run(["umount", "-l", point], check=False)
        for netns in network.list_netns():
            if netns.startswith(f"{self.name}-") and netns[len(self.name) + 1 :].isdigit():
                self._destroy_host({"netns": netns, "veth": "", "dir": str(self.dir / "hosts" / netns)})
        cgroups.remove(cgroups.lab_dirs(self.name))
        with network.network_lock():
            cgroups.remove_empty_parents(self.name)
            network.delete_nat(self.nat_comment)
            network.delete_link(self.bridge)
            shutil.rmtree(self.dir, ignore_errors=True)
            network.restore_ip_forward(STATE_ROOT)
        return {"lab": self.name, "removed": removed, "changed": bool(removed)}

    def gateway(self) -> str:
        """The lab bridge's address: each host's default gateway, where lab services listen."""
        state = self.load()
        if not state.get("subnet") or not state.get("hosts"):
            raise LabError(f"lab {self.name!r} is not up: bring it up first (make lab-up LAB={self.name})")
        return str(next(ipaddress.ip_network(state["subnet"]).hosts()))

    def is_stale(self) -> bool:
        """True when the lab has state but none of its hosts is alive (its processes were killed), and no
        `up` is bringing it up right now (busy)."""
        hosts = self.load().get("hosts", {}).values()
        return not any(host_running(h) for h in hosts) and not self.busy()

    # ----- views ---------------------------------------------------------------------------------
    def instances(self, state: dict | None = None) -> list[dict]:
        state = state or self.load()
        return [
            {
                "name": r["name"],
                "address": r["address"],
                "profile": r["profile"],
                "leader_pid": current_boot(r).get("leader_pid"),
                "ssh_key": str(self.key_file),
            }
            for r in sorted(state.get("hosts", {}).values(), key=lambda r: r["index"])
        ]

    def status(self) -> dict:
        state = self.load()
        hosts = []
        for record in sorted(state.get("hosts", {}).values(), key=lambda r: r["index"]):
            alive = host_running(record)
            hosts.append(
                {
                    "name": record["name"],
                    "address": record["address"],
                    "profile": record["profile"],
                    "state": self._system_state(record) if alive else "stopped",
                }
            )
        return {
            "lab": self.name,
            "subnet": state.get("subnet"),
            "bridge": state.get("bridge"),
            "hosts": hosts,
        }

    def record(self, host: str) -> dict:
        state = self.load()
        if host not in state.get("hosts", {}):
            raise LabError(f"no host {host!r} in lab {self.name!r} (hosts: {', '.join(state.get('hosts', {}))})")
        return current_boot(state["hosts"][host])


def all_lab_names() -> list[str]:
    return sorted(p.parent.name for p in STATE_ROOT.glob("*/state.json"))
