"""Run ``python -m sglang.bench_serving ARGS`` once per job in ONE interpreter, so its imports load once.

    <bench client python> serving_bench_sweep.py  < jobs.json   # [{"argv": [...], "log": "/path/c16.log"}, ...]

Each job is what ``python -m sglang.bench_serving ARGS`` does: ``runpy.run_module("sglang.bench_serving",
run_name="__main__")`` with ``sys.argv`` set, a fresh module namespace each time, stdout and stderr to the job's
log. Importing bench_serving (transformers, datasets, pyarrow, IPython) takes seconds of CPU; a sweep pays it
once instead of once per concurrency. Prints a JSON list of exit statuses.
"""

from __future__ import annotations

import contextlib
import json
import runpy
import sys
import traceback


def run(argv: list[str], log_path: str) -> int:
    rc = 0
    with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        sys.argv = ["bench_serving.py", *argv]
        try:
            runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            if isinstance(exc.code, int):
                rc = exc.code
            elif exc.code is not None:
                log.write(f"{exc.code}\n")  # as the interpreter prints a SystemExit's message (stderr is the log)
                rc = 1
        except BaseException:  # noqa: BLE001 - like the interpreter: print the traceback, exit 1
            traceback.print_exc()
            rc = 1
    return rc


def main() -> None:
    jobs = json.load(sys.stdin)
    statuses = [run(job["argv"], job["log"]) for job in jobs]
    sys.stdout.write(json.dumps(statuses) + "\n")


if __name__ == "__main__":
    main()
