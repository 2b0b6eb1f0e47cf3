"""gpufleet lab: local "GPU VMs" with a real systemd, as systemd-nspawn containers.

Lab and test equipment, never part of a production deployment. Each lab host is a
systemd-nspawn container booted from a cached Debian 12 root filesystem on an overlayfs,
with its own network namespace, address, hostname, ssh key and NAT to the package mirrors.
"""

__version__ = "0.1.0"
