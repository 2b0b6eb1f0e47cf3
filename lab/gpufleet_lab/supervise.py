"""A lab host's supervisor (lab equipment): runs the host's systemd-nspawn and boots the host again when it
reboots, as a VM's hypervisor would.

systemd-nspawn exits with status 133 when the container's init asks for a reboot (systemd-nspawn(1): "If the
container requests a reboot, systemd-nspawn exits with status 133"; seen on the lab: `systemctl reboot` in a
host ends its nspawn, "Rebooting." last in nspawn.log). A real VM comes back on its own; without this the lab
host would stay off and `ansible.builtin.reboot` (the sglang_server role's reboot remedy) could never be
proven on the lab. The host boots again with the same root, network namespace and machine UUID, a new boot
ID (nspawn gives every boot its own) and an empty /dev/shm (the simulated GPUs' state is gone, as a real
reboot frees GPU memory).

    python -m gpufleet_lab.supervise systemd-nspawn -b -D ROOT ...   # the lab tool starts it (lab.py)

SIGTERM or SIGINT is passed to nspawn and ends the supervisor once nspawn has exited (`down` stops a host this
way); any exit of nspawn other than a reboot ends it too, with nspawn's status.
"""

from __future__ import annotations

import signal
import subprocess
import sys

NSPAWN_REBOOT_EXIT = 133


def main(argv: list[str] | None = None) -> int:
    command = sys.argv[1:] if argv is None else argv
    if not command:
        print("usage: python -m gpufleet_lab.supervise systemd-nspawn ARGS...", file=sys.stderr)
        return 2
    child: subprocess.Popen | None = None
    stopping = False

    def forward(signum, _frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    boots = 0
    while True:
        boots += 1
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        rc = child.wait()
        if stopping or rc != NSPAWN_REBOOT_EXIT:
            return rc if rc >= 0 else 128 - rc
        print(
            f"gpufleet-lab supervisor: the host rebooted (systemd-nspawn exit {rc}); boot {boots + 1} begins",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
