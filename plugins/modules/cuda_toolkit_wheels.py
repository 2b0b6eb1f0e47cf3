#!/usr/bin/python
"""Ansible module: lay out NVIDIA's CUDA compiler wheels as a normal /usr/local/cuda-X.Y tree."""

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_toolkit_wheels
short_description: Install a CUDA toolkit tree from NVIDIA's PyPI wheels (CUDA 13.x and later)
description:
  - Finds each wheel on a PEP 503 index (PyPI by default) or in a flat wheelhouse (a directory URL listing or a
    directory on the host), downloads it into a cache, verifies its sha256, and extracts the toolkit tree the
    wheels carry (C(nvidia/cu13/)) into O(dest), which then works as C(CUDA_HOME) exactly like an apt install.
  - Fixes the layout the wheels lack - C(lib64 -> lib) (nvcc.profile links with C(-L$(TOP)/lib64)),
    C(libcudart.so -> libcudart.so.N) for C(-cudart shared), and mode 0755 on executables - and drops wheel-only
    metadata (C(.metadata/)).
  - Idempotent without network access - a manifest (C(.gpufleet-cuda-wheels.json)) in O(dest) records the
    wheels and files; when it matches O(packages) and every file is present nothing is fetched.
  - A different wheel set replaces the tree atomically (new tree built beside it, then swapped), so a failed
    install leaves the old tree as it was. Other directories (other toolkit versions) are never touched.
  - Supports check mode.
version_added: "1.0.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  dest:
    description: The toolkit directory to create, e.g. C(/usr/local/cuda-13.0).
    type: path
    required: true
  packages:
    description: The wheels, each a dict with C(name), C(version) and optionally C(sha256) (of the Linux wheel for
      this architecture; when absent, the index's C(#sha256=) fragment is used, and one of them is required).
    type: list
    elements: dict
    required: true
  tree_prefix:
    description: The directory inside the wheels that holds the toolkit tree.
    type: str
    default: nvidia/cu13
  index_url:
    description: A PEP 503 simple index (C(<index_url>/<project>/) lists the files).
    type: str
    default: https://pypi.org/simple
  find_links:
    description: A flat wheelhouse instead of an index - an C(http(s)://) URL of a page linking the wheel files, or a
      directory on the host. Takes precedence over O(index_url).
    type: str
  download_dir:
    description: Where downloaded wheels are kept on the host (reused when the checksum matches).
    type: path
    default: /var/cache/gpufleet/cuda-wheels
  platform:
    description: Machine the wheel must be built for (the C(manylinux_*_<platform>) tag).
    type: str
    default: x86_64
  timeout:
    description: Seconds to wait for each HTTP request.
    type: int
    default: 300
"""

EXAMPLES = r"""
- name: CUDA 13.0 from PyPI into /usr/local/cuda-13.0
  cuda_toolkit_wheels:
    dest: /usr/local/cuda-13.0
    packages:
      - {name: nvidia-cuda-nvcc, version: 13.0.88}
      - {name: nvidia-nvvm, version: 13.0.88}
      - {name: nvidia-cuda-crt, version: 13.0.88}
      - {name: nvidia-cuda-runtime, version: 13.0.96}
      - {name: nvidia-cuda-cccl, version: 13.0.85}

- name: The same from a site wheelhouse
  cuda_toolkit_wheels:
    dest: /usr/local/cuda-13.0
    find_links: http://wheels.example.internal/cuda/
    packages: "{{ cuda_toolkit_wheels_packages }}"
"""

RETURN = r"""
dest:
  description: The toolkit directory.
  returned: always
  type: str
wheels:
  description: The wheels installed (name, version, file, sha256, url).
  returned: always
  type: list
  elements: dict
files:
  description: Number of files in the tree.
  returned: always
  type: int
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from html.parser import HTMLParser
from urllib.parse import unquote, urljoin, urlparse

try:
    from ansible.module_utils.basic import AnsibleModule
    from ansible.module_utils.urls import open_url
except ImportError:  # unit tests import the helpers without Ansible's module machinery
    AnsibleModule = None
    open_url = None

MANIFEST = ".gpufleet-cuda-wheels.json"
SKIP_PREFIXES = (".metadata/",)


class WheelError(Exception):
    pass


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def parse_links(html, base_url):
    """(file name, absolute URL without fragment, sha256 or None) for each link of an index page."""
    parser = _Anchors()
    parser.feed(html)
    links = []
    for href in parser.hrefs:
        url, _sep, fragment = urljoin(base_url, href).partition("#")
        name = unquote(url.rsplit("/", 1)[-1])
        digest = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
        links.append((name, url, digest))
    return links


def normalize(name):
    """PEP 503 project name (nvidia-cuda-nvcc) and PEP 427 file name prefix part (nvidia_cuda_nvcc)."""
    project = re.sub(r"[-_.]+", "-", name).lower()
    return project, project.replace("-", "_")


def select_wheel(links, name, version, platform, sha256=None):
    """The link of the Linux wheel of name==version for platform; prefers an exact sha256 match."""
    prefix = f"{normalize(name)[1]}-{version}-"
    candidates = []
    for fname, url, digest in links:
        if not fname.lower().startswith(prefix) or not fname.endswith(".whl"):
            continue
        platforms = fname[:-4].split("-")[-1].split(".")
        if not any(p.startswith(("manylinux", "linux")) and p.endswith("_" + platform) for p in platforms):
            continue
        candidates.append((fname, url, digest))
    if sha256:
        exact = [c for c in candidates if c[2] in (sha256, None)]
        candidates = exact or candidates
    if not candidates:
        raise WheelError(f"no {platform} Linux wheel of {name}=={version} found (looked for {prefix}*.whl)")
    return candidates[0]


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_members(names, tree_prefix):
    """(member, relative path) of the files under tree_prefix/ that belong in the toolkit tree."""
    top = tree_prefix.strip("/") + "/"
    out = []
    for member in names:
        if not member.startswith(top) or member.endswith("/"):
            continue
        rel = member[len(top) :]
        if not rel or rel.startswith(SKIP_PREFIXES) or ".." in rel.split("/"):
            continue
        out.append((member, rel))
    return out


def extract_tree(wheel_paths, dest, tree_prefix):
    """Extract the toolkit tree of every wheel into dest; returns the sorted relative file paths."""
    files = set()
    for path in wheel_paths:
        with zipfile.ZipFile(path) as zf:
            for member, rel in tree_members(zf.namelist(), tree_prefix):
                target = os.path.join(dest, rel)
                os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                with zf.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                zip_mode = zf.getinfo(member).external_attr >> 16
                os.chmod(target, 0o755 if zip_mode & 0o111 else 0o644)
                files.add(rel)
    return sorted(files)


def fix_layout(dest):
    """The links a normal toolkit tree has and the wheels lack; directories 0755. Returns the links made."""
    made = []
    lib, lib64 = os.path.join(dest, "lib"), os.path.join(dest, "lib64")
    if os.path.isdir(lib) and not os.path.lexists(lib64):
        os.symlink("lib", lib64)
        made.append("lib64")
    if os.path.isdir(lib):
        for soname in sorted(os.listdir(lib)):
            match = re.match(r"^(lib(?:cudart|nvvm|nvrtc))\.so\.[0-9]+$", soname)
            link = os.path.join(lib, f"{match.group(1)}.so") if match else None
            if link and not os.path.lexists(link):
                os.symlink(soname, link)
                made.append(f"lib/{match.group(1)}.so")
    for root, dirs, _unused in os.walk(dest):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    os.chmod(dest, 0o755)
    return made


def read_manifest(dest):
    try:
        with open(os.path.join(dest, MANIFEST)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def manifest_matches(manifest, packages, dest):
    """True when dest holds exactly the wheels asked for (same versions and, when given, checksums)."""
    if not manifest:
        return False
    have = {w["name"]: w for w in manifest.get("wheels", [])}
    if set(have) != {normalize(p["name"])[0] for p in packages}:
        return False
    for pkg in packages:
        got = have[normalize(pkg["name"])[0]]
        if got.get("version") != str(pkg["version"]):
            return False
        if pkg.get("sha256") and got.get("sha256") != pkg["sha256"]:
            return False
    return all(os.path.lexists(os.path.join(dest, rel)) for rel in manifest.get("files", []))


class Fetcher:
    def __init__(self, module, params):
        self.module = module
        self.params = params

    def _read(self, url):
        if url.startswith("file://"):
            with open(urlparse(url).path, "rb") as fh:
                return fh.read()
        resp = open_url(url, timeout=self.params["timeout"], http_agent="gpufleet-cuda-toolkit")
        return resp.read()

    def links_for(self, name):
        find_links = self.params.get("find_links")
        if find_links and "://" not in find_links:
            if not os.path.isdir(find_links):
                raise WheelError(f"wheelhouse directory {find_links} does not exist on the host")
            return [
                (f, "file://" + os.path.join(os.path.abspath(find_links), f), None)
                for f in sorted(os.listdir(find_links))
            ]
        page = (
            find_links.rstrip("/") + "/"
            if find_links
            else f"{self.params['index_url'].rstrip('/')}/{normalize(name)[0]}/"
        )
        try:
            return parse_links(self._read(page).decode("utf-8", "replace"), page)
        except Exception as exc:  # noqa: BLE001 - any transport error becomes a clear message
            raise WheelError(f"cannot read {page}: {exc}") from exc

    def fetch(self, pkg):
        name, version = pkg["name"], str(pkg["version"])
        fname, url, digest = select_wheel(
            self.links_for(name), name, version, self.params["platform"], pkg.get("sha256")
        )
        expected = pkg.get("sha256") or digest
        if not expected:
            raise WheelError(f"no sha256 known for {fname}: give one in the package entry (the index gives none)")
        if pkg.get("sha256") and digest and digest != pkg["sha256"]:
            raise WheelError(f"{fname}: the index says sha256 {digest}, the role expects {pkg['sha256']}")
        os.makedirs(self.params["download_dir"], mode=0o755, exist_ok=True)
        target = os.path.join(self.params["download_dir"], fname)
        if not (os.path.exists(target) and sha256_file(target) == expected):
            fd, tmp = tempfile.mkstemp(dir=self.params["download_dir"], prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(self._read(url))
                got = sha256_file(tmp)
                if got != expected:
                    raise WheelError(f"{fname} from {url} has sha256 {got}, expected {expected}: refused")
                os.chmod(tmp, 0o644)
                os.replace(tmp, target)
            except Exception as exc:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                if isinstance(exc, WheelError):
                    raise
                raise WheelError(f"cannot download {url}: {exc}") from exc
        return {"name": normalize(name)[0], "version": version, "file": fname, "sha256": expected, "url": url}, target


def install(module, params):
    dest = params["dest"].rstrip("/")
    packages = params["packages"]
    for pkg in packages:
        if not pkg.get("name") or not pkg.get("version"):
            raise WheelError(f"package entry {pkg!r} needs name and version")
    manifest = read_manifest(dest)
    if manifest_matches(manifest, packages, dest):
        return {"changed": False, "dest": dest, "wheels": manifest["wheels"], "files": len(manifest["files"])}
    if module.check_mode:
        return {"changed": True, "dest": dest, "wheels": [], "files": 0}
    fetcher = Fetcher(module, params)
    fetched = [fetcher.fetch(pkg) for pkg in packages]
    parent = os.path.dirname(dest)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(dest)}.new-")
    try:
        files = extract_tree([path for _unused, path in fetched], staging, params["tree_prefix"])
        if not files:
            raise WheelError(f"the wheels hold no files under {params['tree_prefix']}/: wrong tree_prefix?")
        links = fix_layout(staging)
        record = {"wheels": [info for info, _unused in fetched], "files": files + links}
        with open(os.path.join(staging, MANIFEST), "w") as fh:
            json.dump(record, fh, indent=2, sort_keys=True)
        os.chmod(os.path.join(staging, MANIFEST), 0o644)
        old = None
        if os.path.lexists(dest):
            old = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(dest)}.old-")
            os.rmdir(old)
            os.rename(dest, old)
        os.rename(staging, dest)
        if old:
            shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.unlink(old)
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"changed": True, "dest": dest, "wheels": record["wheels"], "files": len(record["files"])}


def main():
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "packages": {"type": "list", "elements": "dict", "required": True},
            "tree_prefix": {"type": "str", "default": "nvidia/cu13"},
            "index_url": {"type": "str", "default": "https://pypi.org/simple"},
            "find_links": {"type": "str"},
            "download_dir": {"type": "path", "default": "/var/cache/gpufleet/cuda-wheels"},
            "platform": {"type": "str", "default": "x86_64"},
            "timeout": {"type": "int", "default": 300},
        },
        supports_check_mode=True,
    )
    try:
        result = install(module, module.params)
    except WheelError as exc:
        module.fail_json(msg=str(exc), dest=module.params["dest"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
