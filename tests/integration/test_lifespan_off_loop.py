"""Issue 15 item 5: the gateway's start-up does its blocking file and network
work (finding, maybe downloading, the default model; reading a chat template
file) off the event loop. The template here is a named pipe nobody writes to
yet: reading it blocks, and the loop must keep running meanwhile."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from app.factory import create_app
from app.settings import Settings, WorkerSettings


async def test_the_lifespan_reads_blocking_files_in_a_thread(tmp_path):
    fifo = tmp_path / "template.jinja"
    os.mkfifo(fifo)
    settings = Settings(workers=(WorkerSettings(
        name="w", kind="local", engine="llamacpp", model=str(tmp_path / "absent.gguf"),
        models=("m",), chat_template=str(fifo)),))
    app = create_app(settings)

    def writer() -> None:  # unblocks the reader in any case, so a failure cannot hang
        time.sleep(2.0)
        with open(fifo, "w") as fh:
            fh.write("{{ messages }}")

    threading.Thread(target=writer, daemon=True).start()
    loop = asyncio.get_running_loop()
    started = loop.time()
    context = app.router.lifespan_context(app)
    entering = asyncio.ensure_future(context.__aenter__())
    ticks: list[float] = []
    while loop.time() - started < 1.5:
        await asyncio.sleep(0.05)
        ticks.append(loop.time() - started)
    # the loop ran all along while the template could not be read yet
    assert not entering.done()
    assert sum(0.5 < t < 1.5 for t in ticks) >= 5
    entering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await entering
