#!/usr/bin/env python3
"""Run ``poolgate`` (or the floor) with tracemalloc on; SIGUSR1 dumps a snapshot and object counts.

    python bench/memprobe.py --dump DIR serve --config ... --port ...
    python bench/memprobe.py --dump DIR --floor --upstream URL --port P

On SIGUSR1 it reads a label from ``DIR/next``, writes ``DIR/<label>.snap``
(a tracemalloc snapshot, 8 frames per allocation), ``DIR/<label>.types.json``
(live objects per type, from ``gc.get_objects()``) and then ``DIR/<label>.done``.
``bench/memdiff.py`` compares two labels. Used by ``bench/open_streams.py
--tracemalloc``; tracemalloc slows the gateway and adds its own memory, so the
RSS figures of such a run are not the bench's numbers.
"""

from __future__ import annotations

import gc
import json
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this checkout's poolgate, not the one installed in the venv


def _dump(where: Path) -> None:
    label = (where / "next").read_text().strip() or "snap"
    gc.collect()
    tracemalloc.take_snapshot().dump(str(where / f"{label}.snap"))
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for o in gc.get_objects():
        key = f"{getattr(type(o), '__module__', '?')}.{type(o).__qualname__}"
        code = getattr(o, "cr_code", None) or getattr(o, "ag_code", None) or getattr(o, "gi_code", None)
        if code is not None:  # which coroutine or generator: their frames are the cost
            key += f" {code.co_qualname}"
        counts[key] += 1
        sizes[key] += sys.getsizeof(o)
    (where / f"{label}.types.json").write_text(json.dumps(dict(counts.most_common(600))))
    (where / f"{label}.sizes.json").write_text(json.dumps(dict(sizes.most_common(600))))
    (where / f"{label}.done").write_text("ok")


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] != "--dump":
        print(__doc__, file=sys.stderr)
        return 2
    where = Path(sys.argv[2])
    where.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(8)
    signal.signal(signal.SIGUSR1, lambda signum, frame: _dump(where))
    if sys.argv[3:4] == ["--floor"]:
        from floor import main as floor_main   # bench/ is sys.path[0]
        floor_main(sys.argv[4:])
        return 0
    sys.argv = ["poolgate", *sys.argv[3:]]
    from app.cli import main as poolgate_main
    return poolgate_main()


if __name__ == "__main__":
    sys.exit(main())
