"""Routing policies: which of the eligible workers takes a request.

The caller filters first (ready, serves the model, not draining, not cooling
down, and — under admission — has a free slot) and hands the survivors to a
policy. A policy only chooses; it never waits and never raises for an empty
list (the caller never passes one).

* :class:`LeastInFlight` — the least busy worker; ties go to the session's
  rendezvous winner, or round robin when there is no session.
* :class:`SessionAffinity` — a session stays on the worker it was bound to
  (binding kept in a :class:`BindingStore` with a time to live); a new session
  is placed by rendezvous hashing, so a worker joining or leaving moves only
  about 1/N of the sessions; no session → the fallback policy.
* ``prefix_cache`` (:class:`pool.prefix_policy.PrefixCacheAware`) — the worker
  that served the longest prefix of the prompt lately, unless load says
  otherwise; explicit sessions as under affinity.

``pool`` imports nothing from ``sessions``: :class:`BindingStore` is defined
here and ``sessions.bindings`` implements it (structurally).
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Callable, Mapping, Protocol, Sequence

from .model import ChatRequest
from .worker import Worker

__all__ = [
    "RoutingPolicy", "BindingStore", "LeastInFlight", "SessionAffinity", "make_policy",
    "POLICIES", "rendezvous", "binding_key", "lighter",
]

POLICIES = ("session_affinity", "least_in_flight", "prefix_cache")


class RoutingPolicy(Protocol):
    async def choose(self, request: ChatRequest, session: str | None,
                     workers: Sequence[Worker]) -> Worker:
        """One of ``workers`` (never empty) for ``request``; ``session`` is the
        request's session key, or ``None`` when it has none."""
        ...

    def stats(self) -> dict[str, int]: ...

    def placed(self, request: ChatRequest, worker: Worker) -> None:
        """``request`` was admitted on ``worker`` (chosen by this policy or,
        when only one worker was free, without asking it)."""
        ...


class BindingStore(Protocol):
    """Session key → worker name, each binding with a time to live.

    ``get`` is a sliding read: a hit extends the binding's life to a full
    time to live (Redis: ``GETEX key EX ttl``, one round trip), so a session
    in use never expires and the router never writes on a hit.
    """

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, worker: str, ttl: float | None = None) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def claim(self, key: str, expected: str | None, worker: str,
                    ttl: float | None = None) -> str:
        """Compare and set: bind ``key`` to ``worker`` if it is bound to
        ``expected`` (``None``: unbound); return the binding now held (``worker``
        when the claim won, the other replica's choice when it lost)."""
        ...


def rendezvous(key: str, workers: Sequence[Worker]) -> Worker:
    """The highest-random-weight worker for ``key``: a stable choice that only
    changes for the keys a joining worker wins or a leaving worker held.

    Score of a worker: the 8-byte BLAKE2b digest of ``key NUL name``, compared
    as bytes (big-endian); the name breaks a 64-bit tie so order never matters.
    """
    if len(workers) == 1:
        return workers[0]
    seed = blake2b(key.encode() + b"\x00", digest_size=8)
    best = workers[0]
    best_score = b""
    for worker in workers:
        hasher = seed.copy()  # cheaper than hashing the key again per worker
        hasher.update(worker.name.encode())
        score = hasher.digest()
        if score > best_score or (score == best_score and worker.name > best.name):
            best, best_score = worker, score
    return best


def lighter(home: Worker, workers: Sequence[Worker], in_flight: Callable[[str], int],
            imbalance_abs: int, imbalance_rel: float) -> Worker | None:
    """The least loaded of ``workers`` when ``home`` holds more than
    ``imbalance_abs`` requests more than it *and* more than ``imbalance_rel``
    times as many (SGLang's cache-aware router's test); else ``None``."""
    if len(workers) == 1:
        return None
    load = in_flight(home.name)
    if load <= imbalance_abs:
        return None
    least, least_load = home, load
    for worker in workers:
        n = in_flight(worker.name)
        if n < least_load:
            least, least_load = worker, n
    if load - least_load > imbalance_abs and load > imbalance_rel * least_load:
        return least
    return None


def binding_key(model: str, session: str) -> str:
    """The store key of ``session``'s binding for ``model``.

    Bindings are per model: Claude Code sends one session id with both its
    main model and a small fast one, and the two are usually served by
    different workers; one binding per session would flap between them.
    """
    return f"{model}\x1f{session}"


class LeastInFlight:
    """The worker with the fewest requests in flight (``in_flight(name)``)."""

    def __init__(self, in_flight: Callable[[str], int]) -> None:
        self._in_flight = in_flight
        self._turn = 0
        self._picks = 0

    async def choose(self, request: ChatRequest, session: str | None,
                     workers: Sequence[Worker]) -> Worker:
        return self.pick(session, workers)

    def pick(self, session: str | None, workers: Sequence[Worker]) -> Worker:
        """The synchronous core of :meth:`choose` (other policies reuse it)."""
        self._picks += 1
        if len(workers) == 1:
            return workers[0]
        loads = [self._in_flight(w.name) for w in workers]
        least = min(loads)
        idle = [w for w, n in zip(workers, loads) if n == least]
        if len(idle) == 1:
            return idle[0]
        if session is not None:
            return rendezvous(session, idle)
        self._turn += 1
        return idle[self._turn % len(idle)]

    def stats(self) -> dict[str, int]:
        return {"picks": self._picks}

    def placed(self, request: ChatRequest, worker: Worker) -> None:
        pass  # load is all it weighs, and the admission guard counts that


class SessionAffinity:
    """Keep a session on its worker; place new sessions by rendezvous hashing.

    * bound worker among ``workers`` → it (a ``hit``; the store's sliding
      ``get`` refreshed the binding, no write);
    * no binding (new or expired) → rendezvous winner among ``workers``,
      stored (a ``bind``);
    * bound worker not among ``workers`` → rendezvous winner among
      ``workers``, stored (a ``rebind``). The session then stays on its new
      worker when the old one returns: moving it back would throw away the
      new worker's warm cache a second time. Only once the binding expires
      (idle for a whole time to live) is it placed afresh, and then by hash
      — which is where it started if the worker set is as it was.
    * ``busy(name)`` given and true for the bound worker: it is eligible but
      has no free slot, so this request goes elsewhere (by hash) without
      rebinding (a ``spill``); the next turn goes home again.
    * ``session`` is ``None`` → the ``fallback`` policy (a ``no_session``).
    * an *implicit* session (a content hash or an OpenAI ``user``: guesses, not
      a client's word that these requests belong together) keeps its worker
      only while the load stays balanced, as SGLang's cache-aware router
      does: when its worker holds more than ``imbalance_abs`` requests more
      than the least loaded one *and* more than ``imbalance_rel`` times as
      many, the request goes to the least loaded worker (a ``load_move``).
      A session moved on consecutive turns has moved for good: its binding
      follows (a ``load_rebind``). Explicit sessions (headers,
      ``previous_response_id``, a CLI conversation) stay put unless their
      worker is full or gone.

    Concurrent first turns of one session agree without coordination: the
    hash gives each the same worker, so their racing writes store one value.
    """

    def __init__(self, store: BindingStore, *, fallback: RoutingPolicy,
                 ttl: float | None = None,
                 busy: Callable[[str], bool] | None = None,
                 in_flight: Callable[[str], int] | None = None,
                 imbalance_abs: int = 2, imbalance_rel: float = 1.5,
                 owned: bool = False) -> None:
        self._store = store
        # session keys carry their API key's name first ("team-a:content:…")
        self._owned = owned
        self._fallback = fallback
        self._ttl = ttl
        self._busy = busy
        self._in_flight = in_flight
        self._imbalance_abs = imbalance_abs
        self._imbalance_rel = imbalance_rel
        # implicit sessions whose last turn was moved for load (bounded: a hint, not state)
        self._moved: dict[str, None] = {}
        self._hits = self._binds = self._rebinds = self._spills = self._no_session = 0
        self._load_moves = self._load_rebinds = 0

    async def choose(self, request: ChatRequest, session: str | None,
                     workers: Sequence[Worker]) -> Worker:
        if session is None:
            self._no_session += 1
            return await self._fallback.choose(request, None, workers)
        key = binding_key(request.model, session)
        bound = await self._store.get(key)
        if bound is not None:
            for worker in workers:
                if worker.name == bound:
                    lighter = self._lighter(session, worker, workers)
                    if lighter is not None:
                        return await self._move(key, lighter)
                    self._moved.pop(key, None)
                    self._hits += 1
                    return worker
            if self._busy is not None and self._busy(bound):
                self._spills += 1
                return rendezvous(session, workers)
        worker = rendezvous(session, workers)
        lighter = self._lighter(session, worker, workers)
        if lighter is not None:
            self._load_moves += 1
            return lighter  # not bound: the next turn tries its hashed home again
        # compare and set: a replica with another view of the workers may have
        # bound (or rebound) this session meanwhile; its choice wins if we can use it
        held = await self._store.claim(key, bound, worker.name, self._ttl)
        if held != worker.name:
            for other in workers:
                if other.name == held:
                    self._hits += 1
                    return other
        if bound is None:
            self._binds += 1
        else:
            self._rebinds += 1
        return worker

    async def held_by(self, request: ChatRequest, session: str | None) -> str | None:
        """The worker an explicit ``session`` is bound to for ``request``'s model
        (``None``: unbound, no session, or a guess: an implicit session)."""
        if session is None or self.implicit(session):
            return None
        return await self._store.get(binding_key(request.model, session))

    def _lighter(self, session: str, home: Worker, workers: Sequence[Worker]) -> Worker | None:
        """The least loaded worker when ``home`` is too busy for an implicit session to wait."""
        if self._in_flight is None or not self.implicit(session):
            return None
        return lighter(home, workers, self._in_flight, self._imbalance_abs, self._imbalance_rel)

    def implicit(self, session: str) -> bool:
        """Whether ``session`` is the gateway's guess (a content hash, a ``user``)."""
        if self._owned:
            session = session.partition(":")[2]  # after the owner's name, which holds no ':'
        return session.startswith(_IMPLICIT)

    async def _move(self, key: str, to: Worker) -> Worker:
        self._load_moves += 1
        if key in self._moved:  # moved last turn too: the load has moved for good
            del self._moved[key]
            await self._store.set(key, to.name, self._ttl)
            self._load_rebinds += 1
        else:
            if len(self._moved) >= _MAX_MOVED:
                del self._moved[next(iter(self._moved))]
            self._moved[key] = None
        return to

    def stats(self) -> dict[str, int]:
        return {"hits": self._hits, "binds": self._binds, "rebinds": self._rebinds,
                "spills": self._spills, "no_session": self._no_session,
                "load_moves": self._load_moves, "load_rebinds": self._load_rebinds}

    def placed(self, request: ChatRequest, worker: Worker) -> None:
        pass  # bindings are written while choosing


# Session keys that are the gateway's guesses (see ``sessions.keys``), not a client's word.
_IMPLICIT = ("content:", "user:")
_MAX_MOVED = 10_000


def make_policy(name: str, *, in_flight: Callable[[str], int],
                store: BindingStore | None = None, ttl: float | None = None,
                busy: Callable[[str], bool] | None = None, imbalance_abs: int = 2,
                imbalance_rel: float = 1.5, owned: bool = False,
                prefix: Mapping[str, float] | None = None) -> RoutingPolicy:
    """The policy a model's configuration names (``POLICIES``).

    ``in_flight(name)`` counts a worker's requests in flight (the admission
    guard's); ``store`` holds session bindings (required for
    ``session_affinity`` and ``prefix_cache``; share one store across models —
    keys carry the model); ``busy(name)`` tells an eligible worker without a
    free slot; ``imbalance_abs`` / ``imbalance_rel`` when implicit sessions
    (and prefix matches) yield to load; ``owned``: session keys start with
    their API key's name; ``prefix``: the ``prefix_cache`` policy's
    ``block_chars``, ``min_match``, ``max_blocks`` and ``max_age``.
    """
    if name == "least_in_flight":
        return LeastInFlight(in_flight)
    if name not in ("session_affinity", "prefix_cache"):
        raise ValueError(f"unknown routing policy {name!r}; expected one of {', '.join(POLICIES)}")
    if store is None:
        raise ValueError(f"the {name} policy needs a binding store")
    affinity = SessionAffinity(store, fallback=LeastInFlight(in_flight), ttl=ttl, busy=busy,
                               in_flight=in_flight, imbalance_abs=imbalance_abs,
                               imbalance_rel=imbalance_rel, owned=owned)
    if name == "session_affinity":
        return affinity
    from .prefix_policy import PrefixCacheAware  # it builds on this module

    knobs = dict(prefix or {})
    return PrefixCacheAware(affinity, LeastInFlight(in_flight), in_flight=in_flight,
                            block_chars=int(knobs.get("block_chars", 128)),
                            min_match=int(knobs.get("min_match", 256)),
                            max_blocks=int(knobs.get("max_blocks", 20_000)),
                            max_age=float(knobs.get("max_age", 600.0)),
                            imbalance_abs=imbalance_abs, imbalance_rel=imbalance_rel)
