"""Write the fleet report (reports/<fleet>/fleet-report.md and .html) from the controller's reports.

    <bench client python> fleet_report.py REPORTS_DIR TEMPLATE [--deploy-dir DIR] [--fleet NAME] [--prometheus URL]

Reads deploy/<host>.json (sglang_server), bench/<host>/<config>/<time>.json and bench/<host>/latest.json
(serving_bench), gate/<host>.json, tune/<host>.json, baselines/*.json and quality/<host>.json (the rollout's quality
gate on a canary, or a quality baseline run: docs/quality-gate.md). The HTML page is self-contained: the
plots (matplotlib, Agg) are PNG images in data: URIs, the style is inline, nothing is fetched.

With --prometheus (the fleet's monitor, docs/observability.md) the report opens with "Now": throughput, TTFT p50/p99
per server, GPU memory per host and the alerts firing, read from the Prometheus HTTP API when the report is written.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(reports: Path, deploy_dir: Path | None = None) -> dict:
    deploy_dir = deploy_dir or reports / "deploy"
    deploy = {p.stem: d for p in sorted(deploy_dir.glob("*.json")) if (d := load(p)) and "host" in d}
    bench_latest, history = {}, {}
    for host_dir in sorted(p for p in (reports / "bench").glob("*") if p.is_dir()):
        runs = sorted(
            (d for p in host_dir.glob("*/*.json") if (d := load(p)) and d.get("results")),
            key=lambda d: d.get("finished_at", ""),
        )
        # per configuration, the newest result at each concurrency (a canary gate measures one point only)
        per_config: dict[str, dict] = {}
        for run in runs:
            merged = per_config.setdefault(run["config_hash"], dict(run, results=[]))
            points = {r["max_concurrency"]: r for r in merged["results"]}
            points.update({r["max_concurrency"]: r for r in run["results"]})
            vs = {v["max_concurrency"]: v for v in merged.get("vs_baseline", [])}
            vs.update({v["max_concurrency"]: v for v in run.get("vs_baseline", [])})
            per_config[run["config_hash"]] = dict(
                run, results=[points[c] for c in sorted(points)], vs_baseline=[vs[c] for c in sorted(vs)]
            )
        history[host_dir.name] = per_config
        latest = load(host_dir / "latest.json")
        if latest and latest.get("config_hash") in per_config:
            bench_latest[host_dir.name] = per_config[latest["config_hash"]]
    gates = {p.stem: d for p in sorted((reports / "gate").glob("*.json")) if (d := load(p))}
    tunes = {p.stem: d for p in sorted((reports / "tune").glob("*.json")) if (d := load(p))}
    baselines = {p.stem: d for p in sorted((reports / "baselines").glob("*.json")) if (d := load(p))}
    quality = {p.stem: d for p in sorted((reports / "quality").glob("*.json")) if (d := load(p))}
    hosts = sorted(set(deploy) | set(bench_latest) | set(gates) | set(tunes) | set(quality))
    return {
        "deploy": deploy,
        "bench": bench_latest,
        "history": history,
        "gates": gates,
        "tunes": tunes,
        "baselines": baselines,
        "quality": quality,
        "hosts": hosts,
    }


def png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def series(run: dict, key: str) -> tuple[list, list]:
    pts = [(r["max_concurrency"], r.get(key)) for r in run.get("results", []) if isinstance(r.get(key), (int, float))]
    pts.sort()
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_throughput(data: dict) -> str | None:
    lines = [(h, cfg, run) for h, per in data["history"].items() for cfg, run in per.items()]
    for name, tune in data["tunes"].items():
        for v in tune.get("variants", []):
            if v.get("results"):
                lines.append((f"{name} tune:{v.get('name')}", v.get("config_hash", ""), v))
    if not lines:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for host, cfg, run in lines:
        label = f"{host} [{str(cfg)[:8]}]"
        for ax, key in zip(axes, ("output_throughput", "total_throughput"), strict=True):
            x, y = series(run, key)
            if x:
                ax.plot(x, y, marker="o", label=label)
    for cls, base in data["baselines"].items():
        x, y = series(base, "output_throughput")
        if x:
            axes[0].plot(x, y, linestyle="--", color="grey", label=f"baseline {cls}")
    for ax, title in zip(axes, ("Output tok/s vs concurrency", "Total tok/s vs concurrency"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("concurrent requests (--max-concurrency)")
        ax.set_ylabel("tokens/s")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return png(fig)


def plot_latency(data: dict) -> str | None:
    if not data["bench"]:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for host, run in data["bench"].items():
        for ax, keys in zip(
            axes, (("median_ttft_ms", "p99_ttft_ms"), ("median_itl_ms", "p95_itl_ms", "p99_itl_ms")), strict=True
        ):
            for key in keys:
                x, y = series(run, key)
                if x:
                    ax.plot(x, y, marker="o", label=f"{host} {key.split('_')[0]}")
    for ax, title in zip(axes, ("Time to first token (ms)", "Inter-token latency (ms)"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return png(fig)


def host_rows(data: dict) -> list[dict]:
    rows = []
    for host in data["hosts"]:
        d = data["deploy"].get(host, {})
        b = data["bench"].get(host, {})
        g = data["gates"].get(host)
        versions = d.get("versions", {})
        timings = d.get("timings", {})
        rollback = d.get("rollback") or {}
        health = d.get("health") or {}
        prompts = health.get("prompts") or []
        rows.append(
            {
                "host": host,
                "result": d.get("result", "no deploy report"),
                "engine": versions.get("engine", "") + (" (simulator)" if versions.get("engine_is_simulator") else ""),
                "release": versions.get("ml_env_release_id", ""),
                "gpu_class": b.get("gpu_class", ""),
                "nccl_env": d.get("nccl_env") or {},
                "health_ok": health.get("ok"),
                "smoke": f"{sum(1 for p in prompts if p.get('ok'))}/{len(prompts)} prompts ok" if prompts else "",
                "timings": {k: v for k, v in timings.items() if isinstance(v, (int, float))},
                "rollback": rollback,
                "config_hash": b.get("config_hash", ""),
                "bench": b.get("results", []),
                "vs_baseline": b.get("vs_baseline", []),
                "bench_finished": b.get("finished_at", ""),
                "gate": g,
                "quality": quality_line(data.get("quality", {}).get(host)),
            }
        )
    return rows


def quality_line(q: dict | None) -> dict | None:
    """The quality gate's verdict on a host (roles/rollout tasks/quality_gate.yml) or a baseline run's score
    (tasks/quality_baseline.yml), as the report shows it: {ok, text}; None when the host has neither."""
    if not q:
        return None
    if q.get("baseline_run"):
        return {"ok": True, "text": f"baseline run {q.get('written_at', '')}: {q.get('reason', '')}"}
    verdict = "PASSED" if q.get("ok") else "REFUSED"
    back = f" ==> ROLLED BACK to release {q.get('rolled_back_to') or '?'}" if q.get("rolled_back") else ""
    where = f"{q.get('gpu_class', '')}, {q.get('model', '')}, {q.get('lane', '')}; run {q.get('run_id', '')}"
    return {"ok": bool(q.get("ok")), "text": f"{verdict} ({where}): {q.get('reason', '')}{back}"}


# The "now" section's queries (the engine's 0.5.9 names, stored as `sglang:` by the monitor's scrape configuration).
_TTFT = 'sum by (instance, le) (rate(sglang:time_to_first_token_seconds_bucket{job="sglang"}[5m]))'
NOW_QUERIES = {
    "tokens_per_s": 'sum by (instance) (rate(sglang:generation_tokens_total{job="sglang"}[5m]))',
    "ttft_p50_s": f"histogram_quantile(0.5, {_TTFT})",
    "ttft_p99_s": f"histogram_quantile(0.99, {_TTFT})",
    "gpu_memory_used_bytes": 'sum by (instance) (gpufleet_gpu_memory_used_bytes{job="node"})',
    "gpu_memory_total_bytes": 'sum by (instance) (gpufleet_gpu_memory_total_bytes{job="node"})',
}  # fmt: skip


def prometheus_now(url: str, timeout: float = 10.0) -> dict:
    """{"url", "at", "hosts": {instance: {query name: value}}, "alerts": [{alertname, instance, severity}]} from the
    Prometheus HTTP API; {"url", "error"} when it does not answer (the report is written anyway)."""

    def query(expr: str) -> list:
        full = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(full, timeout=timeout) as resp:
            answer = json.loads(resp.read())
        if answer.get("status") != "success":
            raise ValueError(f"{expr}: {answer}")
        return answer["data"]["result"]

    try:
        hosts: dict = {}
        for name, expr in NOW_QUERIES.items():
            for r in query(expr):
                value = float(r["value"][1])
                if not math.isnan(value):  # NaN (no traffic in the window): left out
                    hosts.setdefault(r["metric"].get("instance", "?"), {})[name] = value
        alerts = sorted(
            ({k: r["metric"].get(k, "") for k in ("alertname", "instance", "severity")}
             for r in query('ALERTS{alertstate="firing"}')),
            key=lambda a: (a["alertname"], a["instance"]),
        )  # fmt: skip
    except (OSError, ValueError, KeyError) as exc:
        return {"url": url, "error": str(exc)}
    return {"url": url, "at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), "hosts": hosts, "alerts": alerts}


def markdown(data: dict, rows: list[dict]) -> str:
    title = f"gpufleet fleet report: {data['fleet']}" if data["fleet"] else "gpufleet fleet report"
    out = [f"# {title}\n\nWritten {data['generated']}. HTML with plots: `fleet-report.html`.\n"]
    now = data.get("now")
    if now and now.get("error"):
        out.append(f"## Now\n\nPrometheus {now['url']} did not answer: {now['error']}\n")
    elif now:
        out.append(f"## Now\n\nFrom Prometheus {now['url']} at {now['at']}.\n")
        out.append("| host | tokens/s | TTFT p50/p99 s | GPU memory used / total GiB |\n|---|---|---|---|")
        for host, v in sorted(now["hosts"].items()):
            gib = [v.get(k, 0) / 2**30 for k in ("gpu_memory_used_bytes", "gpu_memory_total_bytes")]
            out.append(f"| {host} | {v.get('tokens_per_s', 0):.1f} | {v.get('ttft_p50_s', 0):.3f}/"
                       f"{v.get('ttft_p99_s', 0):.3f} | {gib[0]:.1f} / {gib[1]:.1f} |")  # fmt: skip
        firing = ", ".join(f"{a['alertname']} ({a['instance']})" for a in now["alerts"]) or "none"
        out.append(f"\nAlerts firing: {firing}\n")
    for r in rows:
        out.append(f"## {r['host']}\n")
        out.append("| field | value |\n|---|---|")
        out.append(f"| deploy result | {r['result']} |")
        out.append(f"| engine | {r['engine']} |")
        out.append(f"| ml-env release | {r['release']} |")
        out.append(f"| GPU class | {r['gpu_class']} |")
        out.append(f"| NCCL env | {' '.join(f'{k}={v}' for k, v in sorted(r['nccl_env'].items()))} |")
        health = "ok" if r["health_ok"] else "FAILED" if r["health_ok"] is False else ""
        out.append(f"| health / smoke | {health} {r['smoke']} |")
        out.append(f"| timings (s) | {', '.join(f'{k} {v}' for k, v in r['timings'].items())} |")
        rb = r["rollback"]
        out.append(f"| rollback | {json.dumps(rb) if rb else 'none'} |")
        out.append(f"| configuration | {r['config_hash']} |")
        if r["gate"]:
            g = r["gate"]
            out.append(f"| gate | {'PASSED' if g.get('ok') else 'REFUSED'}: {g.get('reason', '')} |")
        if r["quality"]:
            out.append(f"| quality gate | {r['quality']['text']} |")
        out.append("")
        if r["bench"]:
            out.append(
                "| concurrency | output tok/s | total tok/s | req/s | TTFT p50/p99 ms | ITL p50/p95/p99 ms | failed "
                "| vs baseline |"
            )
            out.append("|---|---|---|---|---|---|---|---|")
            deltas = {v["max_concurrency"]: v.get("delta_pct") for v in r["vs_baseline"]}

            def f(x):
                return f"{x:.2f}" if isinstance(x, (int, float)) else "-"

            for b in r["bench"]:
                dlt = deltas.get(b["max_concurrency"])
                out.append(
                    f"| {b['max_concurrency']} | {f(b.get('output_throughput'))} | {f(b.get('total_throughput'))} | "
                    f"{f(b.get('request_throughput'))} | {f(b.get('median_ttft_ms'))}/{f(b.get('p99_ttft_ms'))} | "
                    f"{f(b.get('median_itl_ms'))}/{f(b.get('p95_itl_ms'))}/{f(b.get('p99_itl_ms'))} | "
                    f"{b.get('failed')} | "
                    f"{'' if dlt is None else f'{dlt:+.1f}%'} |"
                )
            out.append("")
    for host, tune in data["tunes"].items():
        out.append(f"## Tuning on {host}\n")
        out.append("| rank | variant | score | variables |\n|---|---|---|---|")
        for v in tune.get("ranking", []):
            out.append(f"| {v.get('rank')} | {v.get('name')} | {v.get('score')} | `{json.dumps(v.get('vars', {}))}` |")
        out.append(f"\nWinner: {tune.get('winner', {}).get('name', '-')}; copy into group_vars:\n")
        out.append("```yaml\n" + tune.get("winner_yaml", "") + "```\n")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="Write fleet-report.md and .html into a fleet's reports folder.")
    parser.add_argument("reports", type=Path, help="the fleet's reports folder (bench/, gate/, tune/, baselines/)")
    parser.add_argument("template", type=Path, help="templates/fleet-report.html.j2")
    parser.add_argument(
        "--deploy-dir", type=Path, default=None, help="sglang_server's deploy reports (default reports/deploy)"
    )
    parser.add_argument("--fleet", default="", help="the fleet's name, shown in the title")
    parser.add_argument("--prometheus", default="", help="the fleet's Prometheus (the report's 'Now' section)")
    args = parser.parse_args()
    reports, template = args.reports, args.template
    data = collect(reports, args.deploy_dir)
    data["fleet"] = args.fleet
    data["now"] = prometheus_now(args.prometheus) if args.prometheus else None
    data["generated"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    rows = host_rows(data)
    plots = {"throughput": plot_throughput(data), "latency": plot_latency(data)}
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template.parent)), autoescape=True, undefined=jinja2.StrictUndefined
    )
    html = env.get_template(template.name).render(data=data, rows=rows, plots=plots)
    (reports / "fleet-report.html").write_text(html)
    (reports / "fleet-report.md").write_text(markdown(data, rows))
    print(json.dumps({"html": str(reports / "fleet-report.html"), "hosts": data["hosts"]}))


if __name__ == "__main__":
    main()
