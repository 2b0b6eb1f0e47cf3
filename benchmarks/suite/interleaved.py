"""What the interleaved comparisons on a lab kept by fleet_rollout.py (rollout_ab.py, rollout_cores.py) share: rounds
of one rollout per side, the sides' order alternating per round, each rollout a flag change (chunked-prefill-size,
back and forth); then the medians per side (fleet_rollout.compared) saved as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import fleet_rollout

Side = TypeVar("Side")


def alternating(rounds: int, sides: Sequence[Side]) -> Iterator[Side]:
    """The sides of `rounds` rounds in turn, every other round in reverse order (no side always goes first)."""
    for n in range(rounds):
        yield from sides if n % 2 == 0 else sides[::-1]


def flag_changes(sizes: list[int]) -> Iterator[dict]:
    """One rollout_row() per next(): a rollout in batches `sizes` of the chunked-prefill-size the servers do not run
    (4096 and 2048 in turn)."""
    value = 4096
    while True:
        run, value = fleet_rollout.changing_rollout(sizes, 2048 if value == 4096 else 4096)
        yield fleet_rollout.rollout_row(run)


def record(out: dict, row: dict) -> None:
    """A rollout's row into out["rollouts"], and printed (one JSON line)."""
    out["rollouts"].append(row)
    print(json.dumps(row), flush=True)


def save(out: dict, sides: dict[str, tuple[dict, list[dict]]], output: str) -> None:
    """out[name] = the side's fields and the medians of its rows, for each side (name -> (fields, rows)); out written
    to `output` as JSON; a line per side printed."""
    for name, (fields, rows) in sides.items():
        out[name] = {**fields, **fleet_rollout.compared(rows)}
    Path(output).write_text(json.dumps(out, indent=2) + "\n")
    for name in sides:
        print(name, json.dumps(out[name]))
    print(f"saved {output}")
