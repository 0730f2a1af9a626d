"""pool.remote.lean.LeanQueue does what a deque does for the calls aiohttp makes."""

from __future__ import annotations

import random
from collections import deque

from pool.remote.lean import LeanQueue


def test_same_results_as_a_deque_for_a_random_run_of_calls() -> None:
    rng = random.Random(14)
    lean, real = LeanQueue(), deque()
    for step in range(5000):
        op = rng.choice(["append", "appendleft", "popleft", "peek", "set0", "last"])
        if op in ("append", "appendleft"):
            getattr(lean, op)(step)
            getattr(real, op)(step)
        elif real:
            if op == "popleft":
                assert lean.popleft() == real.popleft()
            elif op == "peek":
                assert lean[0] == real[0]
            elif op == "set0":
                lean[0] = real[0] = -step
            else:
                assert lean[-1] == real[-1]
        assert len(lean) == len(real) and bool(lean) == bool(real) and list(lean) == list(real)


def test_built_from_a_deque_keeps_its_order() -> None:
    assert LeanQueue(deque([1, 2, 3])).popleft() == 1
