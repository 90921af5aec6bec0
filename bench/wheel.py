"""Microbenchmark: the hierarchical timing wheel against a heapq with lazy deletion.

For each size N it arms N timers with UUID keys and deadlines spread uniformly over the
preloader's default one-hour lookahead, cancels a random half, then drains the rest the
way the dispatcher's driver does (sleep until ``next_deadline()``, ``advance`` to it),
and separately measures the traced bytes per pending timer after the inserts. The
baseline is what one would write without a wheel: a heap of ``(deadline, seq, key,
item)`` tuples and a dict for O(1) cancel, dead entries skipped when they surface. Keys
and deadlines are created before any measurement, so the byte counts are what each
structure adds on top of data its caller holds anyway. Like ``timeit``, the cyclic GC is
off while a phase is timed; each timing is the best of ``--repeat`` runs.

Run ``python bench/wheel.py [--sizes 10000,100000] [--repeat 3] [--json PATH]``; it
prints a markdown table with the machine and the command. :func:`run_benchmark` is the
importable entry point.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import platform
import random
import shlex
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from chronoshard.scheduler.core.timing_wheel import TimingWheel

DEFAULT_SIZES = (10**4, 10**5, 10**6)
LOOKAHEAD_S = 3600.0  # docs/architecture.md#d6: the preloader keeps the next hour in the wheel
TICK_S = 0.01
SLOTS = 512
START = 1000.0  # any monotonic reading will do


class Timers(Protocol):
    """What the benchmark drives: the wheel's API, which the baseline mimics."""

    def add(self, key: uuid.UUID, deadline: float) -> None: ...
    def cancel(self, key: uuid.UUID) -> bool: ...
    def next_deadline(self) -> float | None: ...
    def advance(self, now: float) -> Sequence[object]: ...


class HeapTimers:
    """The baseline: a binary heap with lazy deletion and a dict for O(1) cancel."""

    __slots__ = ("_heap", "_index", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, uuid.UUID, None]] = []
        self._index: dict[uuid.UUID, tuple[float, int, uuid.UUID, None]] = {}
        self._seq = 0

    def add(self, key: uuid.UUID, deadline: float) -> None:
        entry = (deadline, self._seq, key, None)
        self._seq += 1
        self._index[key] = entry
        heapq.heappush(self._heap, entry)

    def cancel(self, key: uuid.UUID) -> bool:
        return self._index.pop(key, None) is not None

    def next_deadline(self) -> float | None:
        heap = self._heap
        index = self._index
        while heap:
            head = heap[0]
            if index.get(head[2]) is head:
                return head[0]
            heapq.heappop(heap)
        return None

    def advance(self, now: float) -> list[tuple[float, int, uuid.UUID, None]]:
        heap = self._heap
        index = self._index
        fired = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            live = index.pop(entry[2], None)
            if live is entry:
                fired.append(entry)
            elif live is not None:
                index[entry[2]] = live
        return fired


def _new_wheel() -> TimingWheel[uuid.UUID, None]:
    return TimingWheel(START, tick_s=TICK_S, slots=SLOTS)


STRUCTURES: dict[str, Callable[[], Timers]] = {"wheel": _new_wheel, "heapq": HeapTimers}


@dataclass(frozen=True)
class Result:
    structure: str
    timers: int
    insert_s: float  # arm all N timers
    cancel_s: float  # cancel N/2 of them, in random order
    drain_s: float  # driver loop until nothing is pending
    wakeups: int  # advance() calls the driver made while draining
    fired: int
    bytes_per_timer: float  # traced bytes added by the N inserts, divided by N


@dataclass(frozen=True)
class Workload:
    keys: list[uuid.UUID]
    deadlines: list[float]
    cancels: list[uuid.UUID]


def make_workload(timers: int, seed: int) -> Workload:
    rng = random.Random(seed)
    keys = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(timers)]
    deadlines = [START + rng.uniform(0.0, LOOKAHEAD_S) for _ in range(timers)]
    cancels = rng.sample(keys, timers // 2)
    return Workload(keys, deadlines, cancels)


def _timed(action: Callable[[], object]) -> float:
    gc.collect()
    gc.disable()
    try:
        begin = time.perf_counter()
        action()
        return time.perf_counter() - begin
    finally:
        gc.enable()


def _one_run(new: Callable[[], Timers], work: Workload) -> tuple[float, float, float, int, int]:
    timers = new()
    add = timers.add
    cancel = timers.cancel

    def insert() -> None:
        for key, deadline in zip(work.keys, work.deadlines, strict=True):
            add(key, deadline)

    def cancel_half() -> None:
        for key in work.cancels:
            cancel(key)

    counts = [0, 0]  # wake-ups, fired

    def drain() -> None:
        next_deadline = timers.next_deadline
        advance = timers.advance
        wakeups = fired = 0
        while (due := next_deadline()) is not None:
            wakeups += 1
            fired += len(advance(due))
        counts[:] = [wakeups, fired]

    insert_s = _timed(insert)
    cancel_s = _timed(cancel_half)
    drain_s = _timed(drain)
    return insert_s, cancel_s, drain_s, counts[0], counts[1]


def _bytes_per_timer(new: Callable[[], Timers], work: Workload) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        timers = new()
        for key, deadline in zip(work.keys, work.deadlines, strict=True):
            timers.add(key, deadline)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del timers
    return held / len(work.keys)


def run_benchmark(sizes: Sequence[int], repeat: int = 3, seed: int = 0) -> list[Result]:
    """Measure every structure at every size; raise if they disagree on what fired."""
    results: list[Result] = []
    for timers in sizes:
        work = make_workload(timers, seed)
        for name, new in STRUCTURES.items():
            runs = [_one_run(new, work) for _ in range(max(1, repeat))]
            wakeups, fired = runs[0][3], runs[0][4]
            if fired != timers - timers // 2:
                raise AssertionError(f"{name} fired {fired} of {timers - timers // 2} timers")
            results.append(
                Result(
                    structure=name,
                    timers=timers,
                    insert_s=min(run[0] for run in runs),
                    cancel_s=min(run[1] for run in runs),
                    drain_s=min(run[2] for run in runs),
                    wakeups=wakeups,
                    fired=fired,
                    bytes_per_timer=_bytes_per_timer(new, work),
                )
            )
    return results


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


def render_markdown(results: Sequence[Result], machine: dict[str, str], command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {machine['platform']}; CPU {machine['cpu']}, {machine['cores']} cores; "
        f"{machine['python']}. Tick {TICK_S * 1000:g} ms, {SLOTS} slots, deadlines uniform "
        f"over {LOOKAHEAD_S:g} s.",
        "",
        "| timers | structure | insert s (µs/timer) | cancel ½ s (µs/timer) "
        "| drain s (µs/fired) | wake-ups | bytes/pending timer |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cancelled = r.timers // 2
        lines.append(
            f"| {r.timers:,} | {r.structure} "
            f"| {r.insert_s:.3f} ({r.insert_s / r.timers * 1e6:.2f}) "
            f"| {r.cancel_s:.3f} ({r.cancel_s / max(cancelled, 1) * 1e6:.2f}) "
            f"| {r.drain_s:.3f} ({r.drain_s / max(r.fired, 1) * 1e6:.2f}) "
            f"| {r.wakeups:,} | {r.bytes_per_timer:.0f} |"
        )
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError("sizes are integers >= 2, comma-separated")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--sizes", type=_sizes, default=list(DEFAULT_SIZES))
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(args_list)
    command = shlex.join(["python", "bench/wheel.py", *args_list])
    results = run_benchmark(args.sizes, repeat=args.repeat, seed=args.seed)
    host = machine()
    print(render_markdown(results, host, command))
    if args.json is not None:
        document = {
            "benchmark": "wheel",
            "command": command,
            "machine": host,
            "config": {"tick_s": TICK_S, "slots": SLOTS, "lookahead_s": LOOKAHEAD_S},
            "results": [asdict(result) for result in results],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
