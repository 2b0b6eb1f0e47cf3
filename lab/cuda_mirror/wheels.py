"""Download pinned wheels from a PEP 503 "simple" index into a cache, verified by sha256."""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

DEFAULT_INDEX = "https://pypi.org/simple"


class MirrorError(RuntimeError):
    """Building or serving the lab CUDA mirror failed; the message says what and how to fix it."""


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel: the distribution, its version and the sha256 of its x86_64 Linux file."""

    name: str
    version: str
    sha256: str

    @property
    def prefix(self) -> str:
        """File name prefix of the wheel (PEP 427 escapes '-' in the name as '_')."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-"


# The real CUDA 12.8 pieces PyPI has (CUDA 12.8 Update 1 component versions).
CUDA_12_8 = (
    Wheel("nvidia-cuda-nvcc-cu12", "12.8.93", "2d6dc36fb7cb5ac9c0b8825bc13d193c35487a315664007287d0126531238011"),
    Wheel("nvidia-cuda-runtime-cu12", "12.8.90", "adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90"),
    Wheel("nvidia-cuda-nvrtc-cu12", "12.8.93", "a7756528852ef889772a84c6cd89d41dfa74667e24cca16bb31f8f061e3e9994"),
)
# A complete CUDA 13.0 compiler (served as a wheelhouse for the role's `wheels` method).
CUDA_13_0 = (
    Wheel("nvidia-cuda-nvcc", "13.0.88", "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"),
    Wheel("nvidia-nvvm", "13.0.88", "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"),
    Wheel("nvidia-cuda-crt", "13.0.88", "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"),
    Wheel("nvidia-cuda-runtime", "13.0.96", "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"),
    Wheel("nvidia-cuda-cccl", "13.0.85", "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"),
)


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def parse_links(html: str, base_url: str) -> list[tuple[str, str, str | None]]:
    """(file name, absolute URL without fragment, sha256 from the fragment or None) of each link."""
    parser = _Anchors()
    parser.feed(html)
    links = []
    for href in parser.hrefs:
        url, _, fragment = urllib.parse.urljoin(base_url, href).partition("#")
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        digest = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
        links.append((name, url, digest))
    return links


def sha256_of(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _read(url: str) -> bytes:
    if url.startswith("file://"):  # a local index (e.g. file:///opt/pypi/simple): pages are index.html
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
        return (path / "index.html" if path.is_dir() else path).read_bytes()
    with urllib.request.urlopen(url, timeout=120) as resp:  # noqa: S310 - index URL chosen by the operator
        return resp.read()


def fetch(wheel: Wheel, dest_dir: Path, index_url: str | None = None, log=print) -> Path:
    """The cached wheel file, downloading it from the index when it is missing or corrupt."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    for cached in dest_dir.glob(f"{wheel.prefix}*.whl"):
        if sha256_of(cached) == wheel.sha256:
            return cached
    index = (index_url or os.environ.get("GPUFLEET_PYPI_INDEX") or DEFAULT_INDEX).rstrip("/")
    project = re.sub(r"[-_.]+", "-", wheel.name).lower()
    page_url = f"{index}/{project}/"
    try:
        links = parse_links(_read(page_url).decode("utf-8", "replace"), page_url)
    except OSError as exc:
        raise MirrorError(f"cannot read the package index page {page_url}: {exc}") from exc
    chosen = [(n, u) for n, u, d in links if n.startswith(wheel.prefix) and n.endswith(".whl") and d == wheel.sha256]
    if not chosen:
        chosen = [(n, u) for n, u, _ in links if n.startswith(wheel.prefix) and n.endswith("x86_64.whl")]
    if not chosen:
        raise MirrorError(f"{page_url} lists no x86_64 Linux wheel of {wheel.name} {wheel.version}")
    name, url = chosen[0]
    log(f"cuda-mirror: downloading {name}")
    tmp = dest_dir / f".{name}.part"
    try:
        tmp.write_bytes(_read(url))
    except OSError as exc:
        raise MirrorError(f"cannot download {url}: {exc}") from exc
    got = sha256_of(tmp)
    if got != wheel.sha256:
        tmp.unlink()
        raise MirrorError(f"{name} from {url} has sha256 {got}, expected {wheel.sha256}: refusing it")
    target = dest_dir / name
    os.replace(tmp, target)
    return target
