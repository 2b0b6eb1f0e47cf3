"""Verify an ml-env release; run with the release's own python.

usage: python ml_env_verify.py LOCK_FILE [--import MOD ...] [--cuda]

1. every distribution pinned in LOCK_FILE (a hashed requirements lock) is installed at the pinned
   version (importlib.metadata);
2. every --import module imports; its version is reported;
3. with --cuda: torch.cuda.is_available() is true (GPU hosts).
Prints one JSON object {ok, python, modules, mismatches, errors, cuda}; exit 0 when ok, 1 otherwise.
"""

import importlib
import importlib.metadata as md
import json
import platform
import re
import sys
import traceback

REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;\\]+)")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path):
    found = {}
    with open(path) as handle:
        for line in handle:
            match = REQ.match(line.strip())
            if match:
                found[norm(match.group(1))] = match.group(3)
    return found


def main(argv):
    lock, imports, cuda = None, [], False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--import":
            imports.append(args.pop(0))
        elif arg == "--cuda":
            cuda = True
        else:
            lock = arg
    result = {
        "ok": True,
        "python": platform.python_version(),
        "executable": sys.executable,
        "modules": {},
        "mismatches": [],
        "errors": [],
        "cuda": None,
    }
    installed = {norm(d.metadata["Name"]): d.version for d in md.distributions() if d.metadata["Name"]}
    for name, version in sorted(pins(lock).items() if lock else []):
        got = installed.get(name)
        if got != version:
            result["mismatches"].append(f"{name}: lock {version}, installed {got or 'nothing'}")
    dists = md.packages_distributions() if hasattr(md, "packages_distributions") else {}
    for module in imports:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - report any import failure by module name
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            result["errors"].append(f"import {module} failed: {last}")
            continue
        version = getattr(mod, "__version__", None)
        if not version:
            for dist in dists.get(module.split(".")[0], []):
                version = installed.get(norm(dist))
                if version:
                    break
        result["modules"][module] = str(version) if version else "unknown"
    if cuda:
        try:
            import torch

            available = bool(torch.cuda.is_available())
            result["cuda"] = {
                "available": available,
                "torch_cuda": torch.version.cuda,
                "devices": torch.cuda.device_count() if available else 0,
            }
            if not available:
                result["errors"].append(
                    "torch.cuda.is_available() is False on a GPU host (driver? CUDA build of torch?)"
                )
        except Exception as exc:  # noqa: BLE001
            result["errors"].append(f"CUDA check failed: {exc}")
    result["ok"] = not result["errors"] and not result["mismatches"]
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
