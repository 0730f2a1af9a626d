"""The running gateway: what the routes need, built once from Settings."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import structlog

from auth.keys import KeyRing, TokenGate
from auth.limits import MemoryLimits
from pool.admission import AdmissionGuard, Lease
from pool.cli.history import request_prefix_hash
from pool.errors import NotFound
from pool.headroom import QuotaRouting
from pool.model import ChatRequest
from pool.pool import Pool
from pool.signatures import (digest, keep_for, request_digests, signing_account,
                             signs_per_account)
from pool.worker import Worker
from sessions.bindings import MemoryBindingStore
from sessions.keystore import KeyStore
from sessions.ledger import UsageLedger
from sessions.keys import owned_session_key
from sessions.responses import MemoryResponseStore, ResponseStore
from sessions.shared import MemoryDrainedSet, MemoryLocks
from sessions.signatures import MemorySignatureBook
from sessions.upstream import MemoryUpstreamSessions, SessionIndex

from . import access_log
from .observability import current_request
from .record import RequestRecord
from .quota_view import quota_metrics
from .replicas import Drains
from .teams import Teams, model_not_found

__all__ = ["Gateway"]

log = structlog.get_logger("poolgate.gateway")

COUNT_TOKENS_PATH = "/v1/messages/count_tokens"  # counted, not answered: nothing to charge


@dataclass(slots=True, eq=False)
class Gateway:
    settings: Any
    metrics: Any
    admin: TokenGate
    metrics_gate: TokenGate
    metrics_public: bool
    max_body_bytes: int
    ping_interval: float = 10.0
    stream_grace: float = 2.0  # seconds a stream waits for its first event before headers
    pool: Pool = field(default_factory=lambda: Pool(()))
    configured_models: tuple[str, ...] = ()
    responses: ResponseStore = field(default_factory=MemoryResponseStore)
    admission: AdmissionGuard = field(default_factory=lambda: AdmissionGuard(
        global_limit=None, per_key_limit=None, max_wait=5.0))
    bindings: Any = field(default_factory=MemoryBindingStore)  # a BindingStore with stats()
    cli_sessions: SessionIndex = field(default_factory=MemoryUpstreamSessions)
    # which account signed which reasoning (pool/signatures.py)
    signatures: Any = field(default_factory=MemorySignatureBook)
    policy: Any = None  # the default routing policy, built by create_app
    policies: dict[str, Any] = field(default_factory=dict)  # model -> its own policy
    cooldown_seconds: float = 5.0
    quota: QuotaRouting = field(default_factory=QuotaRouting)  # cli accounts' reserves, headroom
    log_requests: bool = True  # an access line per request (log level info or debug)
    keyring: KeyRing = field(default_factory=lambda: KeyRing({}))
    teams: Teams = field(default_factory=lambda: Teams((), MemoryLimits()))
    config_keys: frozenset[str] = frozenset()  # names from the configuration (read-only)
    ledger: UsageLedger | None = None  # set while the app runs
    keystore: KeyStore | None = None  # the run-time keys, set while the app runs
    key_version: int = -1  # the database's key_version this replica's keys reflect
    runtime_workers: Any = None  # app.runtime_workers.RuntimeWorkers, set while the app runs
    redis: Any = None  # the RedisLink when server.redis_url is set
    locks: Any = field(default_factory=MemoryLocks)  # named locks (logins), shared with Redis
    drains: Drains = field(default_factory=lambda: Drains(MemoryDrainedSet()))
    accounts: Any = None  # cli accounts: bundles (app/accounts.py)
    logins: Any = None  # cli accounts: logins (app/logins.py)
    remote_lean: bool = True  # remote workers' lean responses (their self-test passed)
    _tasks: set[Any] = field(default_factory=set)

    async def admit(self, chat: ChatRequest, headers: Mapping[str, str], key: str,
                    prefer: str | None, exclude: Sequence[str]) -> tuple[Lease, ChatRequest]:
        """Filter, admit, route: the eligible workers for ``chat``, a slot under
        the global, per-key and per-worker limits (waiting up to the
        deadline), and the worker the model's policy picks among the free ones
        (``prefer`` first when it is free)."""
        try:
            workers, routed = self.pool.eligible(chat, exclude)
        except NotFound as exc:
            if exc.code != "model_not_found":
                raise
            raise self.unknown_model(key, chat.model) from None
        # in flight by the key's id: a new key with an old name holds none of the old one's slots
        key_id = self.keyring.id_of(key)
        policy = self.policies.get(routed.model, self.policy)
        by_headroom = False
        session: tuple[str | None, Any] | None = None  # the session key, once computed
        if any(w.kind == "cli" for w in workers):
            # cli workers keep per-team state (conversations) by the key (the only
            # readers of key_name): its id, so a new key with an old name inherits
            # nothing; a copy of the request for them, none on the hot path
            record = current_request.get()
            routed = replace(routed, key_name=key_id,
                             request_id=record.request_id if record is not None else None)
            if prefer is None:
                prefix = request_prefix_hash(routed)  # the cli worker holding this conversation
                if prefix is not None:
                    prefer = await self.cli_sessions.get(prefix)
            held_by = getattr(policy, "held_by", None)
            if prefer is None and held_by is not None:  # an explicit session's account
                session = owned_session_key(key_id, routed, headers)
                prefer = await held_by(routed, session[0])
            # a new conversation only where the quota allows (pool/headroom.py);
            # the account holding this one (prefer) keeps it whatever its quota
            workers = self.quota.open_to_new(workers, routed.model, prefer)
            by_headroom = self.quota.by_headroom

        async def choose(free: Sequence[Worker]) -> Worker:
            if len(free) == 1:  # nothing to decide: skip the session key and the policy
                return free[0]
            if prefer is not None:
                for worker in free:
                    if worker.name == prefer:
                        return worker
            if by_headroom:  # a new placement: the accounts with the most left
                free = self.quota.roomiest(free)
            session_key, _source = session or owned_session_key(key_id, routed, headers)
            return await policy.choose(routed, session_key, free)

        teams = self.teams
        if teams.slots is not None and key in teams.policies:  # no Redis for the others
            shared = await teams.take_slot(key, key_id)  # the key's max_in_flight, across replicas
            try:
                lease = await self.admission.acquire(key=key_id, workers=workers, choose=choose)
            except BaseException:
                if shared:
                    teams.slots.give_back(key_id)
                raise
            lease.shared_slot = shared  # given back at the end only if taken (a PATCH may come between)
        else:
            lease = await self.admission.acquire(key=key_id, workers=workers, choose=choose)
        policy.placed(routed, lease.worker)
        self.pool.acquire(lease.worker)
        self.metrics.in_flight_started(lease.worker.name)
        try:
            routed = await self.vet_reasoning(routed, lease.worker, prefer)
        except BaseException:
            self.release(lease)
            raise
        return lease, routed

    async def vet_reasoning(self, routed: ChatRequest, worker: Worker,
                            prefer: str | None) -> ChatRequest:
        """``routed`` without the signed reasoning ``worker``'s account cannot take
        (:mod:`pool.signatures`); ``prefer``: the worker of the previous turn."""
        if not signs_per_account(worker):
            return routed
        digests = request_digests(routed)
        if not digests:  # most requests: nothing signed, nothing to look up
            return routed
        signers = await self.signatures.signers(list(set(digests.values())))
        previous = next((w for w in self.pool.workers if w.name == prefer), None)
        kept, dropped = keep_for(routed, signing_account(worker), digests, signers,
                                 signing_account(previous) if previous is not None else None)
        if dropped:
            log.info("gateway.reasoning_left_behind", worker=worker.name, values=dropped)
        return kept

    def note_signed(self, worker: Worker, values: Iterable[str] | None) -> None:
        """``worker``'s answer handed out these signed reasoning values."""
        if values and signs_per_account(worker):
            self.signatures.note(signing_account(worker), [digest(v) for v in values])

    async def admit_key(self, key: str, model: str) -> None:
        """The key's policy for one request: its models (else a 404 naming
        those it has), its rate and its budget."""
        try:
            await self.teams.admit(key, model)
        except NotFound:
            raise self.unknown_model(key, model) from None

    def unknown_model(self, key: str, model: str) -> NotFound:
        """The 404 for ``model``, naming the models ``key`` may use (as
        ``/v1/models`` lists them for it)."""
        return model_not_found(model, [entry.id for entry in self.pool.models()
                                       if self.teams.sees(key, entry.id)])

    def release(self, lease: Lease) -> None:
        if not lease.released:
            lease.release()
            self.pool.release(lease.worker)
            self.metrics.in_flight_finished(lease.worker.name)
            if lease.shared_slot:
                self.teams.slots.give_back(lease.key)

    def background(self, work: Any) -> None:
        """Run ``work`` (an awaitable) without waiting for it; keep a reference
        so it is not collected half-way."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def in_flight(self, worker: str) -> int:
        return self.pool.in_flight.get(worker, 0)

    def stats(self) -> dict[str, Any]:
        """What ``/internal/stats`` shows: admission, routing, bindings, stores."""
        routing = {"default": self.policy.stats(),
                   **{model: p.stats() for model, p in self.policies.items()}}
        prefix = {model: p.prefix_stats() for model, p in
                  (("default", self.policy), *self.policies.items()) if hasattr(p, "prefix_stats")}
        return {"in_flight": dict(self.pool.in_flight), "admission": self.admission.stats(),
                "routing": routing, "prefix": prefix, "bindings": self.bindings.stats(),
                "responses": self.responses.stats(), "cli_sessions": self.cli_session_stats(),
                "signatures": self.signatures.stats(),
                "redis": self.redis.stats() if self.redis is not None else None,
                "limits": self.limit_stats(),
                "slots": self.teams.slots.stats() if self.teams.slots is not None else None}

    def limit_stats(self) -> dict[str, int] | None:
        """The shared rate windows' counters (leases taken locally, Redis round
        trips, local fallbacks) when the key limits live in Redis; else None."""
        stats = getattr(self.teams.limits, "stats", None)
        return stats() if stats is not None else None

    def cli_session_stats(self) -> dict[str, Any]:
        """The gateway's index of upstream sessions, and each cli worker's hits,
        misses (new conversations) and rebuilds (history resent)."""
        workers = {w.name: w.session_counts() for w in self.pool.workers
                   if hasattr(w, "session_counts")}
        return {"index": self.cli_sessions.stats(), "workers": workers}

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the pool collector exports at scrape time."""
        workers = [{"name": w.name, "state": w.state.value,
                    "restarts": getattr(w, "restarts", 0),
                    "crash_looping": getattr(w, "crash_looping", False),
                    "probe_seconds": self.pool.probe_seconds.get(w.name,
                                                                 getattr(w, "probe_seconds", None))}
                   for w in self.pool.workers]
        stats = self.stats()
        return {"workers": workers, "admission": stats["admission"],
                "routing": stats["routing"], "prefix": stats["prefix"],
                "bindings": stats["bindings"], "cli_sessions": stats["cli_sessions"],
                "redis": self.redis_state(), "ledger": self.ledger_state(),
                "quota": quota_metrics(self.pool.workers, time.time())}

    def ledger_state(self) -> dict[str, Any] | None:
        """The usage ledger's backlog (rows not yet in the database) and failures."""
        ledger = self.ledger
        if ledger is None:
            return None
        return {"backlog": ledger.backlog_rows, "failures": ledger.failures,
                "dropped": ledger.dropped, "up": ledger.up}

    def redis_state(self) -> str:
        """``off`` (no ``server.redis_url``), ``up`` or ``down``."""
        if self.redis is None:
            return "off"
        return "up" if self.redis.up else "down"

    def metrics_upstream_error(self, worker: str, kind: str) -> None:
        self.metrics.observe_upstream_error(worker=worker, kind=kind)

    def _account(self, record: RequestRecord, model: str) -> None:
        """Charge an answered inference request to its key's windows and ledger."""
        tokens_in = record.tokens_in or 0
        tokens_out = record.tokens_out or 0
        key_id = record.key_id  # the key that asked, also if its name was given to another since
        if record.worker is not None and self.keyring.id_of(record.key) == key_id:
            self.teams.charge(record.key, tokens_in + tokens_out)
        if self.ledger is not None:
            self.ledger.add(time.time(), record.key, model, record.worker, tokens_in, tokens_out,
                            record.tokens_cached or 0, record.status, record.error, key_id)

    def finish(self, record: RequestRecord) -> None:
        """The end of every HTTP request: one access log line, the metrics."""
        if record.dialect is not None:
            model = self.pool.model_label(record.model)
            self.metrics.observe_request(
                dialect=record.dialect, model=model,
                worker=record.worker or "none", key=record.key, status=record.status,
                duration=record.duration, ttft=record.ttft,
                tokens_in=record.tokens_in, tokens_out=record.tokens_out,
                tokens_cached=record.tokens_cached)
            if record.path != COUNT_TOKENS_PATH:
                self._account(record, model)
        if record.status < 500 and not self.log_requests:
            return  # info lines are filtered out: don't build one
        access_log.write(record)
