"""Ids handed to clients come from the OS's CSPRNG in batches (app.http.random_hex):
never repeated by ``random.seed``, across threads, or between a process and its fork."""

from __future__ import annotations

import os
import random
import re
import threading

from app.http import new_id, random_hex


def test_ids_are_hex_of_the_length_asked_and_never_repeat_under_random_seed() -> None:
    seen = set()
    for _ in range(3000):  # past several 4 KiB batches
        random.seed(7)
        value = random_hex(32)
        assert re.fullmatch(r"[0-9a-f]{32}", value)
        seen.add(value)
    assert len(seen) == 3000
    assert re.fullmatch(r"resp_[0-9a-f]{24}", new_id("resp_"))


def test_threads_do_not_share_digits() -> None:
    results: list[list[str]] = [[] for _ in range(4)]

    def draw(out: list[str]) -> None:
        out.extend(random_hex(32) for _ in range(2000))

    threads = [threading.Thread(target=draw, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [value for out in results for value in out]
    assert len(set(every)) == len(every) == 8000


def test_a_forked_child_does_not_repeat_its_parents_next_ids() -> None:
    random_hex(32)  # the parent holds a batch with digits left
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, "".join(random_hex(32) for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    parent = "".join(random_hex(32) for _ in range(4))
    assert len(child) == 128 and child != parent
