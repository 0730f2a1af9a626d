#!/usr/bin/env python3
"""Where the memory of open streams goes: compare two bench/memprobe.py dumps.

    .venv/bin/python bench/open_streams.py -n 2000 --targets poolgate --tracemalloc --out D
    .venv/bin/python bench/memdiff.py D/tracemalloc --streams 2000

Prints, per open stream, the Python heap growth from ``idle`` to ``open`` grouped
by allocating line (tracemalloc, innermost frame) and by the first frame in a
chosen package, and the live objects per type (``gc``; containers only: strings
and bytes are not tracked by gc, their size shows in the tracemalloc lines).
What tracemalloc cannot see (C allocations of uvloop, httptools, the kernel's
socket buffers; allocator slack) is the RSS growth minus the heap growth.
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path


def _frame_in(tb: tracemalloc.Traceback, prefixes: tuple[str, ...]) -> str:
    """The innermost frame whose file path contains one of ``prefixes``, else the innermost."""
    for frame in reversed(tb):      # a Traceback runs from the oldest frame to the innermost
        if any(p in frame.filename for p in prefixes):
            return f"{frame.filename.split('/site-packages/')[-1]}:{frame.lineno}"
    f = tb[-1]
    return f"{f.filename.split('/site-packages/')[-1]}:{f.lineno}"


def package(filename: str) -> str:
    """The top-level package of a source file (``asyncio``, ``aiohttp``, ``app`` …)."""
    if "/site-packages/" in filename:
        return filename.split("/site-packages/")[-1].split("/")[0].removesuffix(".py")
    parts = filename.split("/")
    for top in ("app", "pool", "sessions", "auth", "bench"):
        if top in parts[-3:-1]:
            return top
    if "/lib/python3" in filename:
        rest = filename.split("/lib/python3", 1)[1].split("/", 1)[-1]
        return "stdlib " + rest.split("/")[0].removesuffix(".py")
    return filename


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--streams", type=int, required=True, help="streams open in the 'open' dump")
    ap.add_argument("--before", default="idle")
    ap.add_argument("--after", default="open")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--ours", default="/app/,/pool/,/sessions/,/auth/",
                    help="path parts that mark our code, for the by-caller view")
    a = ap.parse_args(argv)
    n = a.streams
    old = tracemalloc.Snapshot.load(str(a.dir / f"{a.before}.snap"))
    new = tracemalloc.Snapshot.load(str(a.dir / f"{a.after}.snap"))
    skip = tracemalloc.Filter(False, tracemalloc.__file__)
    old, new = old.filter_traces([skip]), new.filter_traces([skip])
    total = sum(s.size_diff for s in new.compare_to(old, "filename"))
    print(f"Python heap growth: {total / 1024:,.0f} KiB = {total / n / 1024:.2f} KiB per open stream\n")
    print("by the package of the allocating line (KiB per stream):")
    by_pkg: dict[str, int] = {}
    for s in new.compare_to(old, "filename"):
        key = package(s.traceback[0].filename)
        by_pkg[key] = by_pkg.get(key, 0) + s.size_diff
    for key, size in sorted(by_pkg.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {size / n / 1024:7.2f}  {key}")
    print("\nby allocating line (KiB per stream, allocations per stream):")
    for s in new.compare_to(old, "lineno")[:a.top]:
        f = s.traceback[0]
        print(f"  {s.size_diff / n / 1024:7.2f}  {s.count_diff / n:6.2f}  "
              f"{f.filename.split('/site-packages/')[-1]}:{f.lineno}")
    print("\nby the innermost frame in our code (KiB per stream):")
    ours = tuple(p for p in a.ours.split(",") if p)
    grouped: dict[str, int] = {}
    for s in new.compare_to(old, "traceback"):
        key = _frame_in(s.traceback, ours)
        grouped[key] = grouped.get(key, 0) + s.size_diff
    for key, size in sorted(grouped.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {size / n / 1024:7.2f}  {key}")
    t_old = json.loads((a.dir / f"{a.before}.types.json").read_text())
    t_new = json.loads((a.dir / f"{a.after}.types.json").read_text())
    diff = sorted(((t_new.get(k, 0) - t_old.get(k, 0), k) for k in set(t_old) | set(t_new)),
                  reverse=True)
    sizes = {}
    if (a.dir / f"{a.after}.sizes.json").exists():
        s_old = json.loads((a.dir / f"{a.before}.sizes.json").read_text())
        s_new = json.loads((a.dir / f"{a.after}.sizes.json").read_text())
        sizes = {k: s_new.get(k, 0) - s_old.get(k, 0) for k in set(s_old) | set(s_new)}
        diff.sort(key=lambda dk: -sizes.get(dk[1], 0))
    print("\nlive gc objects per open stream, by type (coroutines and generators by name), "
          "and their bytes (sys.getsizeof, not what they point to):")
    for d, k in diff[:a.top]:
        if d > 0:
            print(f"  {d / n:7.2f}  {sizes.get(k, 0) / n:7.0f} B  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
