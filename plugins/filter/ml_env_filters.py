"""Filters of the ml_env role: the decisions behind a release, as pure functions of plain data.

``ml_env_parse_lock(text)``
    Read a hashed requirements lock (``uv pip compile --generate-hashes`` output): pins, hashes,
    and problems (unpinned or unhashed lines).
``ml_env_release_id(lock_text, python_version, kernels, kernel_tag)``
    The release directory name: a content hash of everything that decides what gets installed.
``ml_env_cuda_archs(gpu_facts)``
    The CUDA architectures of a host as flash-attn spells them (``['120']``, ``['90']``) from the
    gpu_facts role's fact (``compute_caps``, ``archs`` or ``gpus[].compute_cap``).
``ml_env_flash_attn_archs(archs)``
    ``FLASH_ATTN_CUDA_ARCHS`` (``"120"``, ``"90;120"``).
``ml_env_max_jobs(memtotal_mb, vcpus, gib_per_job)``
    ``MAX_JOBS`` for a kernel build, bounded by RAM (each nvcc job can take ~10 GB) and CPUs.
``ml_env_kernel_tag(cuda_version, archs, torch_version, python_version)``
    The wheelhouse sub-directory holding the kernel wheels built for that combination.
``ml_env_kernel_plan(kernels, wheel_files, build_allowed)``
    For each kernel: reuse the wheel found in the wheelhouse, build it, or refuse (missing).
``ml_env_kernel_builder(tags_by_host, tag, explicit)``
    The one host that builds the kernels of a tag (the first host of the play with that tag).
``ml_env_wheelhouse_select(paths, root, packages, kernels, kernel_dir)``
    The wheelhouse files a host needs for a release (copied from a controller wheelhouse), kernel sources included.
``ml_env_prune(releases, keep, protected)``
    The releases to remove: all but the newest ``keep``, never the protected ones.
``ml_env_uv_error(output)``
    A short message naming the packages behind a failed ``uv`` install.

No Ansible import: the unit tests (tests/unit/ml_env/) call these functions directly.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

_REQ_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;]+)")
_HASH_RE = re.compile(r"--hash[= ]([a-z0-9]+):([0-9a-fA-F]+)")


def normalize_name(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in str(text).splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def parse_lock(text: str) -> dict:
    """Pins, hashes and problems of a hashed requirements lock.

    Returns ``{"packages": {name: version}, "hashes": {name: [sha256...]}, "options": [...],
    "problems": [...], "count": n, "sha256": <hash of the text>}``.
    """
    packages: dict[str, str] = {}
    hashes: dict[str, list[str]] = {}
    options: list[str] = []
    problems: list[str] = []
    for line in _logical_lines(text):
        if line.startswith("-"):
            options.append(line)
            continue
        match = _REQ_RE.match(line)
        if not match:
            problems.append(f"not pinned with '==': {line.split()[0]}")
            continue
        name, version = normalize_name(match.group(1)), match.group(3)
        if name in packages:
            problems.append(f"{name} is pinned twice ({packages[name]} and {version})")
        packages[name] = version
        found = [h for algo, h in _HASH_RE.findall(line) if algo == "sha256"]
        if not found:
            problems.append(f"{name}=={version} has no --hash=sha256:...")
        hashes[name] = found
    if not packages:
        problems.append("the lock pins no package")
    return {
        "packages": packages,
        "hashes": hashes,
        "options": options,
        "problems": problems,
        "count": len(packages),
        "sha256": hashlib.sha256(str(text).encode()).hexdigest(),
    }


def release_id(lock_text: str, python_version: str, kernels=None, kernel_tag: str = "") -> str:
    """A 16-hex content hash of what a release contains: the lock, the Python, the kernels and their tag."""
    kernel_specs = sorted(f"{normalize_name(k['name'])}=={k['version']}" for k in (kernels or []))
    payload = json.dumps(
        {
            "lock": hashlib.sha256(str(lock_text).encode()).hexdigest(),
            "python": str(python_version),
            "kernels": kernel_specs,
            "kernel_tag": kernel_tag if kernel_specs else "",
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _cap_to_arch(cap) -> str | None:
    text = str(cap).strip().lower()
    if not text or text in ("none", "n/a", "[n/a]"):
        return None
    if text.startswith("sm_"):
        text = text[3:]
        return text if text.isdigit() else None
    match = re.fullmatch(r"(\d+)\.(\d+)", text)
    if match:
        return f"{int(match.group(1))}{int(match.group(2))}"
    return text if text.isdigit() else None


def cuda_archs(gpu_facts) -> list[str]:
    """Architectures (``['90', '120']``, sorted numerically) from the gpu_facts role's fact."""
    facts = gpu_facts or {}
    if not isinstance(facts, dict):
        return []
    sources = list(facts.get("compute_caps") or [])
    sources += list(facts.get("archs") or [])
    sources += [g.get("compute_cap") for g in (facts.get("gpus") or []) if isinstance(g, dict)]
    found = {a for a in (_cap_to_arch(s) for s in sources if s is not None) if a}
    return sorted(found, key=int)


def flash_attn_archs(archs) -> str:
    """``FLASH_ATTN_CUDA_ARCHS`` value: semicolon-separated, sorted (flash-attn's setup.py splits on ';')."""
    if isinstance(archs, str):
        archs = [a for a in re.split(r"[;,\s]+", archs) if a]
    clean = {_cap_to_arch(a) for a in (archs or [])}
    clean.discard(None)
    if not clean:
        raise ValueError("no CUDA architecture: set ml_env_cuda_archs (e.g. ['120']) or gather gpu_facts first")
    return ";".join(sorted(clean, key=int))


def max_jobs(memtotal_mb, vcpus=None, gib_per_job=10, reserve_gib=4, cap=None) -> int:
    """Parallel compile jobs a host can afford: RAM (minus a reserve) / GiB per job, at most its CPUs."""
    mem_gib = float(memtotal_mb or 0) / 1024.0
    by_ram = math.floor(max(mem_gib - float(reserve_gib), 0) / float(gib_per_job))
    jobs = max(1, by_ram)
    if vcpus:
        jobs = min(jobs, int(vcpus))
    if cap:
        jobs = min(jobs, int(cap))
    return max(1, jobs)


def kernel_tag(cuda_version, archs, torch_version=None, python_version=None) -> str:
    """Wheelhouse sub-directory for kernels: ``cu12.8-torch2.9.1-cp312-sm120`` (parts absent when unknown)."""
    parts = [f"cu{cuda_version}"]
    if torch_version:
        parts.append(f"torch{str(torch_version).split('+', maxsplit=1)[0]}")
    if python_version:
        parts.append("cp" + str(python_version).replace(".", ""))
    if isinstance(archs, str):
        archs = [a for a in re.split(r"[;,\s]+", archs) if a]
    parts.append("sm" + "+".join(sorted({_cap_to_arch(a) or str(a) for a in archs or []}, key=_arch_key)))
    return "-".join(parts)


def _arch_key(value: str):
    return (0, int(value)) if str(value).isdigit() else (1, str(value))


_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def wheel_name_version(filename: str):
    match = _WHEEL_RE.match(str(filename).rsplit("/", 1)[-1])
    if not match:
        return None
    return normalize_name(match.group("name")), match.group("version")


def kernel_plan(kernels, wheel_files, build_allowed=True) -> list[dict]:
    """Build-or-reuse decision per kernel.

    ``kernels``: ``[{"name": "flash-attn", "version": "2.8.3.post2", ...}]``;
    ``wheel_files``: file names (or paths) in the tag's wheelhouse directory.
    Each entry of the result: ``name, version, wheel (file or None), action (reuse|build|missing)``.
    """
    found = {}
    for path in wheel_files or []:
        parsed = wheel_name_version(path)
        if parsed:
            found.setdefault(parsed, str(path).rsplit("/", 1)[-1])
    plan = []
    for kernel in kernels or []:
        name, version = normalize_name(kernel["name"]), str(kernel["version"])
        wheel = found.get((name, version))
        action = "reuse" if wheel else ("build" if build_allowed else "missing")
        plan.append({**kernel, "name": kernel["name"], "version": version, "wheel": wheel, "action": action})
    return plan


def _dist_name_version(filename: str):
    """(name, version) of a wheel or an sdist file name (name-version.tar.gz / .zip)."""
    parsed = wheel_name_version(filename)
    if parsed:
        return parsed
    base = str(filename).rsplit("/", 1)[-1]
    for suffix in (".tar.gz", ".zip"):
        if base.endswith(suffix):
            name, _sep, version = base[: -len(suffix)].rpartition("-")
            return (normalize_name(name), version) if name else None
    return None


def wheelhouse_select(paths, root: str, packages: dict, kernels=None, kernel_dir: str = "") -> list[str]:
    """The wheelhouse files a release needs: top-level files pinned by the lock, the kernels' source
    distributions at the top level (what an offline builder compiles: ``pip wheel --no-binary`` finds them
    through ``--find-links``), and the kernels' files in ``kernel_dir`` (the host's tag). Other tags, other
    versions and unrelated files stay behind."""
    root = str(root).rstrip("/")
    pins = {(normalize_name(k), str(v)) for k, v in (packages or {}).items()}
    wanted_kernels = {(normalize_name(k["name"]), str(k["version"])) for k in kernels or []}
    chosen = []
    for path in sorted(str(p) for p in paths or []):
        parent = path.rsplit("/", 1)[0]
        parsed = _dist_name_version(path)
        if not parsed:
            continue
        is_sdist = path.endswith((".tar.gz", ".zip"))
        if (parent == root and (parsed in pins or (is_sdist and parsed in wanted_kernels))) or (
            kernel_dir and parent == kernel_dir and parsed in wanted_kernels
        ):
            chosen.append(path)
    return chosen


def kernel_builder(tags_by_host: dict, tag: str, explicit: str = "") -> str:
    """The host that builds the kernels of ``tag``: ``explicit`` if set, else the first host with that tag."""
    if explicit:
        return explicit
    for host, host_tag in (tags_by_host or {}).items():
        if host_tag == tag:
            return host
    return ""


def _release_entry(entry: dict) -> dict:
    if "id" in entry:
        return entry
    # a find result of <root>/releases/<id>/.ml-env-release.json
    parts = str(entry["path"]).rstrip("/").split("/")
    return {"id": parts[-2], "created": entry.get("mtime", 0)}


def prune(releases, keep=3, protected=None) -> list[str]:
    """Releases to delete, oldest first of those beyond the newest ``keep``; never a protected one.

    ``releases``: ``[{"id": ..., "created": epoch}]`` or the ``files`` of a find of the release markers
    (``{"path": ".../releases/<id>/.ml-env-release.json", "mtime": epoch}``).
    """
    keep = max(int(keep), 1)
    guard = {str(p).rstrip("/").rsplit("/", 1)[-1] for p in (protected or []) if p}
    entries = [_release_entry(r) for r in releases or []]
    ordered = sorted(entries, key=lambda r: float(r.get("created", 0)), reverse=True)
    kept = {r["id"] for r in ordered[:keep]}
    return [r["id"] for r in ordered if r["id"] not in kept and r["id"] not in guard]


_UV_PATTERNS = [
    (re.compile(r"Hash mismatch for `([^`]+)`"), "hash mismatch for {0} (the file differs from the lock)"),
    (
        re.compile(r"Because ([A-Za-z0-9._-]+) was not found in the (?:provided package locations|package registry)"),
        "{0} is not in the wheelhouse or index",
    ),
    (re.compile(r"there is no version of ([A-Za-z0-9._-]+==[^\s,]+)"), "{0} is not in the wheelhouse or index"),
    (re.compile(r"[Nn]o matching distribution found for ([^\s]+)"), "{0} is not in the wheelhouse or index"),
    (re.compile(r"Failed to (?:download|build|prepare distributions)[^`\n]*`([^`\n]+)`"), "could not get {0}"),
    (re.compile(r"Failed to fetch: (\S+)"), "could not fetch {0}"),
    (re.compile(r"`([A-Za-z0-9._-]+==[^`]+)` is missing a hash"), "{0} has no hash in the lock"),
    (re.compile(r"requires a hash"), "a requirement of the lock has no hash"),
]


def uv_error(output: str) -> str:
    """One line naming the packages behind a failed uv run, then the last lines of uv's output."""
    text = str(output or "")
    found: list[str] = []
    for pattern, template in _UV_PATTERNS:
        for match in pattern.finditer(text):
            message = template.format(*match.groups())
            if message not in found:
                found.append(message)
    tail = "\n".join(line for line in text.strip().splitlines()[-12:])
    head = "; ".join(found) if found else "uv failed"
    return f"{head}\n--- uv output (last lines) ---\n{tail}"


class FilterModule:
    def filters(self):
        return {
            "ml_env_parse_lock": parse_lock,
            "ml_env_release_id": release_id,
            "ml_env_cuda_archs": cuda_archs,
            "ml_env_flash_attn_archs": flash_attn_archs,
            "ml_env_max_jobs": max_jobs,
            "ml_env_kernel_tag": kernel_tag,
            "ml_env_kernel_plan": kernel_plan,
            "ml_env_kernel_builder": kernel_builder,
            "ml_env_wheelhouse_select": wheelhouse_select,
            "ml_env_prune": prune,
            "ml_env_uv_error": uv_error,
            "ml_env_normalize_name": normalize_name,
        }
