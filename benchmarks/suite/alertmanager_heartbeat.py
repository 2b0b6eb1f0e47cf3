"""How often Alertmanager sends the heartbeat route (roles/fleet_monitor/templates/alertmanager.yml.j2), measured on
Debian 12's Alertmanager 0.25 run on loopback: a stand-in Prometheus posts an always-firing GpufleetWatchdog every
2 s (endsAt 60 s ahead, as Prometheus' resend does), a local receiver keeps the time of each notification. With
``repeat_interval`` equal to ``group_interval`` the route sends at every other flush (the notification log's time is
taken after the send, the next flush's "now" is the group's timer: dispatch/dispatch.go:440-452,
notify/notify.go:590); with a shorter one at every flush, which the role renders.

The binary: Debian's package unpacked (no service): ``apt-get download prometheus-alertmanager; dpkg-deb -x
prometheus-alertmanager_*.deb am``; its templates must be where the binary looks for them
(``cp -r am/usr/share/prometheus/alertmanager /usr/share/prometheus/``).

    python benchmarks/suite/alertmanager_heartbeat.py --alertmanager am/usr/bin/prometheus-alertmanager
        [--group-interval 10s] [--seconds 65] [--output benchmarks/results/alertmanager_heartbeat.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.server
import json
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PORT = 19093


def measure(binary: str, group_interval: str, repeat_interval: str, seconds: float) -> dict:
    beats: list[float] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            beats.append(time.monotonic())
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "am.yml").write_text(
            "route:\n  receiver: none\n  routes:\n    - matchers: ['alertname=\"GpufleetWatchdog\"']\n"
            f"      receiver: heartbeat\n      group_wait: 0s\n      group_interval: {group_interval}\n"
            f"      repeat_interval: {repeat_interval}\nreceivers:\n  - name: none\n  - name: heartbeat\n"
            f"    webhook_configs:\n      - url: http://127.0.0.1:{receiver.server_address[1]}/ping\n"
            "        send_resolved: false\n"
        )
        am = subprocess.Popen(
            [binary, f"--config.file={work}/am.yml", f"--storage.path={work}", f"--web.listen-address=127.0.0.1:{PORT}",
             "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                now = dt.datetime.now(dt.UTC)
                alert = [{"labels": {"alertname": "GpufleetWatchdog"}, "startsAt": now.isoformat(),
                          "endsAt": (now + dt.timedelta(seconds=60)).isoformat()}]  # fmt: skip
                req = urllib.request.Request(f"http://127.0.0.1:{PORT}/api/v2/alerts", json.dumps(alert).encode(),
                                             {"Content-Type": "application/json"})  # fmt: skip
                with contextlib.suppress(OSError):  # not listening yet
                    urllib.request.urlopen(req, timeout=5).read()
                time.sleep(2)
        finally:
            am.terminate()
            am.wait()
            receiver.shutdown()
    gaps = [round(b - a, 1) for a, b in zip(beats, beats[1:], strict=False)]
    return {"group_interval": group_interval, "repeat_interval": repeat_interval, "notifications": len(beats),
            "gaps_s": gaps}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alertmanager", required=True, help="the prometheus-alertmanager binary")
    parser.add_argument("--group-interval", default="10s")
    parser.add_argument("--seconds", type=float, default=65)
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/alertmanager_heartbeat.json"))
    args = parser.parse_args()
    version = subprocess.run([args.alertmanager, "--version"], capture_output=True, text=True, check=False)
    runs = [measure(args.alertmanager, args.group_interval, repeat, args.seconds) for repeat in (args.group_interval,
                                                                                              "1s")]  # fmt: skip
    result = {"alertmanager": (version.stdout + version.stderr).splitlines()[0], "runs": runs,
              "command": "python benchmarks/suite/alertmanager_heartbeat.py --alertmanager <binary>"}  # fmt: skip
    for run in runs:
        print(f"repeat_interval {run['repeat_interval']:>4} group_interval {run['group_interval']}: "
              f"{run['notifications']} notifications, gaps {run['gaps_s']}")  # fmt: skip
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
