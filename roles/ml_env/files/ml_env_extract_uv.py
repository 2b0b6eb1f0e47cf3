"""Install the static uv binary from a uv wheel (PyPI's uv wheels carry it as uv-<v>.data/scripts/uv).

usage: ml_env_extract_uv.py WHEEL SHA256 DEST_DIR
Checks the wheel's sha256, then writes DEST_DIR/uv (and uvx when present) atomically, mode 0755.
"""

import hashlib
import os
import sys
import zipfile


def main(wheel: str, sha256: str, dest: str) -> int:
    digest = hashlib.sha256()
    with open(wheel, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        print(f"{wheel}: sha256 {digest.hexdigest()} is not the pinned {sha256} (ml_env_uv_wheel_sha256)")
        return 1
    os.makedirs(dest, exist_ok=True)
    found = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            parts = member.split("/")
            if len(parts) == 3 and parts[0].endswith(".data") and parts[1] == "scripts" and parts[2] in ("uv", "uvx"):
                tmp = os.path.join(dest, f".{parts[2]}.tmp")
                with archive.open(member) as src, open(tmp, "wb") as out:
                    out.write(src.read())
                os.chmod(tmp, 0o755)
                os.replace(tmp, os.path.join(dest, parts[2]))
                found += parts[2] == "uv"
    if not found:
        print(f"{wheel} holds no uv binary (<name>.data/scripts/uv)")
        return 1
    print(f"installed {os.path.join(dest, 'uv')}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__)
        raise SystemExit(2)
    raise SystemExit(main(*sys.argv[1:]))
