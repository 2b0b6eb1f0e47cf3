#!/usr/bin/python3 -S
"""Profiling aid (not product code, not lab equipment): a Python interpreter wrapper for a lab host that logs the CPU
of every module run Ansible starts on it.

Installed on a kept lab's hosts and named as the interpreter, it runs ``/usr/bin/python3`` with the same arguments
and standard input (Ansible pipelines the module's AnsiballZ payload on stdin) and appends one JSON line per run to
``/var/tmp/module_cpu.log``: start time, wall time and the CPU (user + system, from ``wait4``: the module and the
processes it waited for, such as ``systemctl`` or ``nvidia-smi``). An async job's module is detached by
async_wrapper, so only its launch is counted. Its own start (``-S``, no site) adds about 10 ms that are not counted.

    python benchmarks/suite/fleet_rollout.py --hosts 5 --repeats 1 --keep-lab
    ansible -i tmp/perf-fleet/hosts.yml all -m copy \\
        -a 'src=benchmarks/module_cpu/module_cpu_wrapper.py dest=/usr/local/bin/module-cpu mode=0755'
    ansible-playbook -i tmp/perf-fleet/hosts.yml playbooks/rollout.yml -l ... \\
        -e ansible_python_interpreter=/usr/local/bin/module-cpu -e ...
    ansible -i tmp/perf-fleet/hosts.yml all -m fetch -a 'src=/var/tmp/module_cpu.log dest=tmp/module-cpu/'

docs/measurements/2026-12-04-fleet-rollout.md (the 07:32 UTC entry, "Where a server host's CPU goes") has what it
showed.
"""

import json
import os
import sys
import time

LOG = "/var/tmp/module_cpu.log"
PYTHON = "/usr/bin/python3"


def main() -> int:
    payload = b"" if sys.stdin.isatty() else sys.stdin.buffer.read()
    read_end, write_end = os.pipe()
    started = time.time()
    pid = os.fork()
    if pid == 0:
        os.close(write_end)
        os.dup2(read_end, 0)
        os.close(read_end)
        os.execv(PYTHON, [PYTHON, *sys.argv[1:]])
    os.close(read_end)
    view = memoryview(payload)
    while view:
        view = view[os.write(write_end, view) :]
    os.close(write_end)
    _, status, usage = os.wait4(pid, 0)
    record = {
        "t": round(started, 3),
        "wall_s": round(time.time() - started, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "argv": sys.argv[1:3],
    }
    with open(LOG, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
