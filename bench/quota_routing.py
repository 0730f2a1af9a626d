#!/usr/bin/env python3
"""Routing by quota: how evenly do four accounts drain, and how many requests
hit a limit, with headroom routing against the plain least-loaded policy?

Four Claude accounts (the fake ``claude`` CLI, tests/fakes/fake_claude.py, in
supervised worker children of a real poolgate on 127.0.0.1) share one model.
The fake Anthropic upstream (tests/fakes/upstreams.py, in this process) keeps
each account's subscription quota and announces it in the
``anthropic-ratelimit-unified-*`` headers the CLI reads; here every answer
costs its account a fixed share of its weekly window, and the accounts
differ in what they start from and what a request costs them (a smaller plan
drains faster):

    account  starts at  each request costs
    a        25 %       0.5 %
    b        30 %       0.5 %
    c        40 %       1.0 %
    d        50 %       1.5 %

Claude Code (2.1.332, and the fake as it) sends every window's numbers in a
``rate_limit_event`` whenever they change, so the gateway's view of an
account is about one of its turns old.
(383 requests in all before every account is spent.) ``--clients`` (4)
clients each run conversations of ``--turns`` (4) turns back to back, a new
conversation after the last turn, until ``--requests`` (200) answers: a
steady, bounded load. Two runs, same load, policy ``least_in_flight``:

* ``least-loaded``: ``routing.quota_routing = false``, the policy alone;
* ``headroom``: the default, a new conversation to the account with the most
  left in its tightest window.

Reported per run: each account's used percent at the end (the upstream's own
count, the truth), the spread (most used − least used) at the end and its
mean and maximum over the run (sampled every 10 answers), requests the
upstream refused because the account was spent ("limit hits": the CLI's
429, after which the account cools down until its reset), and requests that
failed at the client. Counts and spreads, not times: a noisy machine does not
change them much.

    .venv/bin/python bench/quota_routing.py
    .venv/bin/python bench/quota_routing.py --requests 240 --clients 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import httpx  # noqa: E402

from app.factory import create_app  # noqa: E402
from app.settings import RoutingSettings, ServerSettings, Settings  # noqa: E402
from tests.fakes.upstreams import FakeUpstream  # noqa: E402
from tests.fakes.vendor_quota import FakeQuota  # noqa: E402
from tests.support.cli_accounts import claude_home, fake_claude_worker  # noqa: E402
from tests.support.server import ServerThread  # noqa: E402

MODEL = "claude-sonnet-4-6"
KEY = "sk-bench"
#: account -> (used percent at the start, percent each answer costs)
ACCOUNTS = {"a": (25.0, 0.5), "b": (30.0, 0.5), "c": (40.0, 1.0), "d": (50.0, 1.5)}
WEEK = 7 * 86400.0


@dataclass
class DrainingQuota(FakeQuota):
    """A weekly window every answer of the account draws ``cost`` percent
    from; an answer it cannot pay for is the vendor's 429 (a limit hit)."""

    cost: float = 1.0
    answered: int = 0
    refused: int = 0

    def anthropic_headers(self) -> dict[str, str]:
        # the fake upstream asks once per /v1/messages request, then refuses when spent
        if not self.spent:
            if self.seven_day + self.cost > 100:
                self.seven_day = 100.0
            else:
                self.seven_day += self.cost
                self.answered += 1
        if self.spent:
            self.refused += 1
        return super().anthropic_headers()


def token(name: str) -> str:
    return f"sk-ant-oat01-bench-{name}"


def run(mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    with FakeUpstream(models=(MODEL,)) as upstream:
        began = time.time() - 3 * 3600  # the weekly window began three hours ago
        quotas = {n: DrainingQuota(seven_day=start, seven_day_reset=float(int(began + WEEK)),
                                   cost=cost) for n, (start, cost) in ACCOUNTS.items()}
        for name, quota in quotas.items():
            upstream.quota[token(name)] = quota
        workers = tuple(
            fake_claude_worker(name, claude_home(root / mode / name, token(name)),
                               upstream.anthropic_url, root / mode / f"{name}.log",
                               max_conversations=args.conversations)
            for name in ACCOUNTS)
        settings = Settings(
            server=ServerSettings(api_keys={"bench": KEY}, log_level="warning",
                                  queue_timeout=30.0),
            routing=RoutingSettings(policy="least_in_flight",
                                    quota_routing=mode == "headroom"),
            workers=workers)
        with ServerThread(create_app(settings)) as srv:
            return drive(srv.url, quotas, args)


def drive(url: str, quotas: dict[str, DrainingQuota], args: argparse.Namespace) -> dict[str, Any]:
    lock = threading.Lock()
    done = {"ok": 0, "failed": 0, "started": 0}
    spreads: list[float] = []
    served: dict[str, int] = {n: 0 for n in quotas}

    def sample() -> None:
        used = [q.seven_day for q in quotas.values()]
        spreads.append(max(used) - min(used))

    def client(index: int) -> None:
        conversation = 0
        with httpx.Client(base_url=url, timeout=60,
                          headers={"authorization": f"Bearer {KEY}"}) as http:
            while True:
                conversation += 1
                history: list[dict[str, str]] = []
                for turn in range(args.turns):
                    with lock:
                        if done["started"] >= args.requests:
                            return
                        done["started"] += 1
                    history.append({"role": "user",
                                    "content": f"client {index} conversation {conversation} "
                                               f"turn {turn}"})
                    response = http.post("/v1/chat/completions",
                                         json={"model": MODEL, "messages": history})
                    with lock:
                        if response.status_code != 200:
                            done["failed"] += 1
                        else:
                            done["ok"] += 1
                            worker = response.headers.get("x-poolgate-worker", "?")
                            served[worker] = served.get(worker, 0) + 1
                        if (done["ok"] + done["failed"]) % 10 == 0:
                            sample()
                    if response.status_code != 200:
                        break  # the conversation is lost: start a new one
                    reply = response.json()["choices"][0]["message"]["content"]
                    history.append({"role": "assistant", "content": reply})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sample()
    return {"used": {n: q.seven_day for n, q in quotas.items()},
            "answered": {n: q.answered for n, q in quotas.items()},
            "served": served, "limit_hits": sum(q.refused for q in quotas.values()),
            "ok": done["ok"], "failed": done["failed"],
            "spread_end": spreads[-1], "spread_mean": statistics.fmean(spreads),
            "spread_max": max(spreads)}


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(ACCOUNTS)
    head = ("| routing | " + " | ".join(f"{n} used %" for n in names)
            + " | spread at end | mean spread | max spread | limit hits | client errors |"
              " answered |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for mode, r in results.items():
        used = " | ".join(f"{r['used'][n]:.0f}" for n in names)
        lines.append(f"| {mode} | {used} | {r['spread_end']:.0f} | {r['spread_mean']:.1f} | "
                     f"{r['spread_max']:.0f} | {r['limit_hits']} | {r['failed']} | {r['ok']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="answers per run")
    ap.add_argument("--clients", type=int, default=4, help="clients at a time")
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation")
    ap.add_argument("--conversations", type=int, default=4,
                    help="max_conversations per account (its slots)")
    ap.add_argument("--modes", default="least-loaded,headroom")
    args = ap.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="poolgate-quota-bench-") as tmp:
        for mode in args.modes.split(","):
            results[mode] = run(mode, args, Path(tmp))
            print(f"{mode}: served {results[mode]['served']}", file=sys.stderr)
    print(f"{len(ACCOUNTS)} accounts, {args.clients} clients, {args.turns} turns per "
          f"conversation, {args.requests} requests, policy least_in_flight\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
