"""Parsers for the text that ``nvidia-smi`` prints.

Pure standard-library Python: this file is a ``module_utils`` of the collection (imported by the
``gpu_facts`` module as ``ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_smi_parse``) and is
also imported directly by the unit tests, so it must not import ``ansible``.

The formats handled here were checked against real captures from a 2x H200 VM
(driver 580.159.04) and against the shapes newer and older drivers print:

* ``--query-gpu=... --format=csv[,noheader][,nounits]`` and ``--query-compute-apps=...``
  -> :func:`parse_csv_query`
* ``topo -m`` / ``topo -mp`` (tab separated, ANSI-underlined header, optional NIC
  columns, rows and a "NIC Legend:" section) -> :func:`parse_topo_matrix`
* ``topo -p2p r|w|n|a|p`` -> :func:`parse_p2p_matrix`
* the banner line of plain ``nvidia-smi`` (driver and CUDA version; ``cuda_version``
  is not a valid ``--query-gpu`` field) -> :func:`parse_smi_header`
* failures (no driver, no binary, no devices, version mismatch) ->
  :func:`parse_driver_failure`
"""

from __future__ import annotations

import re

__all__ = [
    "NvidiaSmiParseError",
    "strip_ansi",
    "parse_csv_query",
    "parse_topo_matrix",
    "parse_p2p_matrix",
    "parse_smi_header",
    "parse_driver_failure",
    "compute_cap_to_arch",
]


class NvidiaSmiParseError(ValueError):
    """The text is not the nvidia-smi output the parser was asked to read."""


# CSI sequences (``ESC[4m``, ``ESC[0m``, ``ESC[1;32m`` ...) and stray OSC/charset escapes.
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\x1b\][^\x07]*\x07")

# Values nvidia-smi prints where it has no value.
_NULL_VALUES = frozenset(
    {
        "[N/A]",
        "N/A",
        "[Not Supported]",
        "Not Supported",
        "[Unknown Error]",
        "[Insufficient Permissions]",
        "[GPU is lost]",
        "[Requested functionality has been deprecated]",
        "",
    }
)

_UNIT_SUFFIX_RE = re.compile(r"\s*\[[^\]]*\]\s*$")
_NUMBER_UNIT_RE = re.compile(r"^(-?\d+(?:\.\d+)?)\s*([A-Za-z%/]*)$")

# Fields whose values are memory sizes (reported in MiB).
_MEMORY_FIELDS = frozenset({"used_memory", "used_gpu_memory", "gpu_memory", "memory"})
# Fields returned as int (besides memory).
_INT_FIELDS = frozenset(
    {
        "index",
        "count",
        "pid",
        "temperature.gpu",
        "temperature.memory",
        "utilization.gpu",
        "utilization.memory",
        "fan.speed",
        "pcie.link.gen.current",
        "pcie.link.gen.max",
        "pcie.link.width.current",
        "pcie.link.width.max",
    }
)
_FLOAT_PREFIXES = ("power.", "enforced.power", "clocks.")

_GPU_NAME_RE = re.compile(r"^GPU\d+$")
_TOPO_TRAILING_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def strip_ansi(text):
    """Return ``text`` without ANSI escape sequences.

    ``nvidia-smi topo`` wraps its header line in ``ESC[4m ... ESC[0m`` (underline) even
    when its output is redirected to a file or a pipe.  ``None`` is returned as ``""``.
    """
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return _ANSI_RE.sub("", text)


def _field_key(header_name):
    """``"memory.total [MiB]"`` -> ``"memory.total"``."""
    return _UNIT_SUFFIX_RE.sub("", header_name.strip()).strip()


def _is_memory_field(key):
    return key.startswith("memory.") or key in _MEMORY_FIELDS


def _convert_value(key, raw):
    value = raw.strip()
    if value in _NULL_VALUES:
        return None
    if _is_memory_field(key):
        m = _NUMBER_UNIT_RE.match(value)
        if not m:
            return value
        number, unit = m.groups()
        if unit in ("", "MiB"):
            return int(float(number))
        if unit == "GiB":
            return int(float(number) * 1024)
        if unit == "KiB":
            return int(float(number) // 1024)
        return value
    if key in _INT_FIELDS:
        m = _NUMBER_UNIT_RE.match(value)
        if m and "." not in m.group(1):
            return int(m.group(1))
        return value
    if key.startswith(_FLOAT_PREFIXES):
        m = _NUMBER_UNIT_RE.match(value)
        if m:
            return float(m.group(1))
        return value
    return value


def _split_csv_line(line, width, names):
    """Split one nvidia-smi CSV row (``", "`` separated, never quoted)."""
    parts = line.split(", ")
    if len(parts) != width:
        parts = [p.strip() for p in line.split(",")]
    if len(parts) > width:
        # A comma inside a free-text value (process name, GPU name): give the surplus to
        # the first free-text column.
        for free in ("process_name", "name", "gpu_name"):
            if free in names:
                i = names.index(free)
                extra = len(parts) - width
                parts[i : i + extra + 1] = [", ".join(parts[i : i + extra + 1])]
                break
    if len(parts) != width:
        raise NvidiaSmiParseError(f"expected {width} comma-separated values, got {len(parts)}: {line!r}")
    return parts


def parse_csv_query(text, header=True, fields=None):
    """Parse ``--query-gpu=...`` / ``--query-compute-apps=...`` CSV output.

    :param text: the command's stdout.
    :param header: ``True`` if the output has a header line (``--format=csv``),
        ``False`` for ``--format=csv,noheader``.
    :param fields: the queried field names (list, or the comma-separated string given to
        ``--query-gpu=``); required when ``header`` is false, and when given with a header
        it names the keys instead of the header (useful for aliases like ``gpu_name``).
    :returns: a list of dicts, one per row, keyed by field name without the unit
        (``"memory.total [MiB]"`` -> ``"memory.total"``).  Values are stripped strings
        except: ``None`` for ``[N/A]``/``N/A``/``[Not Supported]``; ``int`` MiB for memory
        fields (``"143771 MiB"`` or ``"143771"``); ``int`` for index, count, pid,
        temperature and utilization; ``float`` for power and clock fields
        (``"700.00 W"`` -> ``700.0``).
    :raises NvidiaSmiParseError: on nvidia-smi's error text (``Field "x" is not a valid
        field to query.``, driver failures) or rows of the wrong width.
    """
    clean = strip_ansi(text).replace("\r\n", "\n")
    lines = [ln.rstrip() for ln in clean.split("\n")]
    lines = [ln for ln in lines if ln.strip()]
    if lines:
        first = lines[0]
        if first.startswith("Field ") and "not a valid field" in first:
            raise NvidiaSmiParseError(first)
        failure = parse_driver_failure(0, clean, "")
        if failure:
            raise NvidiaSmiParseError(failure)
    if isinstance(fields, str):
        fields = [f.strip() for f in fields.split(",") if f.strip()]
    if header:
        if not lines:
            raise NvidiaSmiParseError("no header line in CSV output")
        header_names = [_field_key(h) for h in lines[0].split(",")]
        names = list(fields) if fields else header_names
        if len(names) != len(header_names):
            raise NvidiaSmiParseError(f"{len(names)} fields given but the header has {len(header_names)}")
        rows = lines[1:]
    else:
        if not fields:
            raise NvidiaSmiParseError("fields are required to parse CSV output without a header")
        names = [_field_key(f) for f in fields]
        rows = lines
    result = []
    for line in rows:
        parts = _split_csv_line(line, len(names), names)
        result.append({name: _convert_value(name, raw) for name, raw in zip(names, parts, strict=True)})
    return result


def _split_cells(line):
    """Split a matrix line: by TAB (real output) or, for pasted copies, by 2+ spaces."""
    if "\t" in line:
        return line.split("\t")
    return re.split(r" {2,}", line)


def _nullify(value):
    value = (value or "").strip()
    return None if value in _NULL_VALUES else value


def parse_topo_matrix(text):
    """Parse ``nvidia-smi topo -m`` (or ``topo -mp``).

    The header line starts with a TAB and is ANSI-underlined; rows start with the device
    name; the self cell is ``" X "``; after the link cells come CPU Affinity, NUMA
    Affinity and GPU NUMA ID (rows carry an extra empty field between the last two).
    Newer drivers add NIC columns after the GPU columns, NIC rows after the GPU rows and
    a ``NIC Legend:`` section (``NIC0: mlx5_0``); older ones name NIC columns after the
    device (``mlx_0``).  NIC columns are never taken as GPUs.

    :returns: ``{"gpus": ["GPU0", ...],
                 "links": {"GPU0": {"GPU1": "NV18"}},       # GPU<->GPU, self omitted
                 "nic_links": {"GPU0": {"NIC0": "PIX"}},    # GPU->NIC, {} without NICs
                 "cpu_affinity": {"GPU0": "0-31"},
                 "numa_affinity": {"GPU0": "0"},
                 "gpu_numa_id": {"GPU0": None},             # "N/A" -> None
                 "nics": ["NIC0", ...],
                 "nic_names": {"NIC0": "mlx5_0"}}``
    :raises NvidiaSmiParseError: if no header with GPU columns is found.
    """
    lines = strip_ansi(text).replace("\r\n", "\n").split("\n")
    header_cells = None
    body_start = 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        cells = [c.strip() for c in _split_cells(line)]
        if any(_GPU_NAME_RE.match(c) for c in cells) and not _GPU_NAME_RE.match(cells[0] or ""):
            header_cells = [c for c in cells if c]
            body_start = i + 1
            break
        if cells and _GPU_NAME_RE.match(cells[0]):
            break  # a row before any header
    if header_cells is None:
        raise NvidiaSmiParseError("no topology header line (GPU columns) found")

    devices = []
    trailing = []
    for name in header_cells:
        if name in _TOPO_TRAILING_COLUMNS or trailing:
            trailing.append(name)
        else:
            devices.append(name)
    gpus = [d for d in devices if _GPU_NAME_RE.match(d)]
    nics = [d for d in devices if not _GPU_NAME_RE.match(d)]

    result = {
        "gpus": gpus,
        "links": {},
        "nic_links": {},
        "cpu_affinity": {},
        "numa_affinity": {},
        "gpu_numa_id": {},
        "nics": nics,
        "nic_names": {},
    }
    in_nic_legend = False
    for line in lines[body_start:]:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped == "Legend:":
            in_nic_legend = False
            continue
        if stripped == "NIC Legend:":
            in_nic_legend = True
            continue
        if in_nic_legend:
            m = re.match(r"^(\S+):\s*(\S+)", stripped)
            if m:
                result["nic_names"][m.group(1)] = m.group(2)
            continue
        cells = _split_cells(line)
        row = cells[0].strip()
        if row not in gpus:
            continue  # NIC rows, legend text
        link_cells = [c.strip() for c in cells[1 : 1 + len(devices)]]
        links = {}
        nic_links = {}
        for col, cell in zip(devices, link_cells, strict=False):
            if col == row:
                continue
            if col in gpus:
                links[col] = cell
            else:
                nic_links[col] = cell
        result["links"][row] = links
        result["nic_links"][row] = nic_links
        rest = [c.strip() for c in cells[1 + len(devices) :] if c.strip()]
        values = dict(zip(trailing, rest, strict=False))
        result["cpu_affinity"][row] = _nullify(values.get("CPU Affinity"))
        result["numa_affinity"][row] = _nullify(values.get("NUMA Affinity"))
        result["gpu_numa_id"][row] = _nullify(values.get("GPU NUMA ID"))
    return result


def parse_p2p_matrix(text):
    """Parse ``nvidia-smi topo -p2p r|w|n|a|p``.

    Rows start with a space (``" GPU0\\tX\\tOK\\t"``), the header is ANSI-underlined and
    lines end with a TAB.  Status codes: ``OK``, ``CNS``, ``GNS``, ``TNS``, ``NS``,
    ``DR``, ``U``; the self cell ``X`` is omitted from the result.  A GPU that is in the
    header but has no row (or a short row) is reported in ``missing_rows`` / left out of
    ``status``; nothing raises for a partial table.

    :returns: ``{"gpus": ["GPU0", "GPU1"],                  # header order
                 "status": {"GPU0": {"GPU1": "OK"}, ...},
                 "missing_rows": []}``
    :raises NvidiaSmiParseError: if no header with GPU columns is found.
    """
    lines = strip_ansi(text).replace("\r\n", "\n").split("\n")
    columns = None
    status = {}
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Legend:"):
            break
        cells = [c.strip() for c in _split_cells(line.strip("\n"))]
        cells_nonempty = [c for c in cells if c]
        if not cells_nonempty:
            continue
        if columns is None:
            if all(_GPU_NAME_RE.match(c) for c in cells_nonempty):
                columns = cells_nonempty
            continue
        row = cells_nonempty[0]
        if not _GPU_NAME_RE.match(row):
            continue
        values = cells_nonempty[1:]
        status[row] = {col: val for col, val in zip(columns, values, strict=False) if col != row and val != "X"}
    if columns is None:
        raise NvidiaSmiParseError("no peer-to-peer header line (GPU columns) found")
    rows_seen = list(status)
    gpus = list(columns) + [r for r in rows_seen if r not in columns]
    return {
        "gpus": gpus,
        "status": status,
        "missing_rows": [g for g in columns if g not in status],
    }


_SMI_HEADER_RE = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+(?:Driver|KMD) Version:\s+(?P<driver>\S+)\s+"
    r"CUDA(?: UMD)? Version:\s+(?P<cuda>[^\s|]+)"
)


def parse_smi_header(text):
    """Read the banner of plain ``nvidia-smi``.

    ``| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |``
    -> ``{"smi_version": "580.159.04", "driver_version": "580.159.04",
    "cuda_version": "13.0"}``.  ``cuda_version`` is ``None`` when it reads ``N/A`` or
    ``Not Found``.  Returns ``None`` when there is no banner.
    """
    m = _SMI_HEADER_RE.search(strip_ansi(text))
    if not m:
        return None
    cuda = m.group("cuda")
    if cuda in ("N/A", "Not"):
        cuda = None
    return {"smi_version": m.group("smi"), "driver_version": m.group("driver"), "cuda_version": cuda}


def parse_driver_failure(rc, stdout, stderr):
    """Explain why an nvidia-smi call failed, or return ``None`` if it did not.

    Recognised: the binary missing (rc 127, ``command not found``, ``No such file``);
    ``NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver``
    (rc 9, driver not loaded); ``Failed to initialize NVML: Driver/library version
    mismatch``; other ``Failed to initialize NVML`` errors; ``No devices were found``
    (rc 6); ``Unable to determine the device handle`` / ``GPU is lost``; insufficient
    permissions.  Any other non-zero rc gives a generic message with the first output
    line.  rc 0 with none of these texts gives ``None``.

    :returns: a one-line human message, or ``None``.
    """
    out = strip_ansi(stdout or "")
    err = strip_ansi(stderr or "")
    both = f"{out}\n{err}"
    low = both.lower()

    def first_line(text):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
        return ""

    if rc == 127 or "command not found" in low or ("no such file or directory" in low and "nvidia-smi" in low):
        return "nvidia-smi not found: the NVIDIA driver utilities are not installed (command not found)"
    if "couldn't communicate with the nvidia driver" in low:
        return (
            "NVIDIA driver not loaded: nvidia-smi couldn't communicate with the NVIDIA driver "
            f"(rc {rc}); install the driver and load the kernel module, or reboot after installing"
        )
    if "driver/library version mismatch" in low:
        return (
            "NVIDIA driver/library version mismatch: the loaded kernel module and the user-space "
            "driver differ (reboot, or unload and reload the nvidia modules)"
        )
    if "failed to initialize nvml" in low:
        line = next((ln.strip() for ln in both.splitlines() if "Failed to initialize NVML" in ln), "")
        return f"NVML failed to initialize: {line}"
    if "no devices were found" in low:
        return f"no NVIDIA GPU found: the driver is loaded but sees no device (rc {rc})"
    if "unable to determine the device handle" in low or "gpu is lost" in low:
        return "a GPU is lost or unreachable: " + first_line(
            "\n".join(ln for ln in both.splitlines() if "device handle" in ln or "lost" in ln) or both
        )
    if "insufficient permissions" in low:
        return "insufficient permissions to query the NVIDIA driver"
    if rc not in (0, None):
        detail = first_line(err) or first_line(out) or "no output"
        return f"nvidia-smi failed (rc {rc}): {detail}"
    return None


def compute_cap_to_arch(compute_cap):
    """``"12.0"`` -> ``"sm_120"``, ``"9.0"`` -> ``"sm_90"``, ``"8.6"`` -> ``"sm_86"``.

    Accepts a string or a number; ``None`` gives ``None``.
    :raises ValueError: for anything that is not ``MAJOR.MINOR``.
    """
    if compute_cap is None:
        return None
    text = str(compute_cap).strip()
    m = re.fullmatch(r"(\d+)\.(\d+)", text)
    if not m:
        raise ValueError(f"not a compute capability (MAJOR.MINOR): {compute_cap!r}")
    return f"sm_{int(m.group(1))}{int(m.group(2))}"
