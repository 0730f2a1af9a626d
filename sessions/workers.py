"""Remote workers registered at run time (``POST /internal/workers``): name →
the registration, a JSON-able mapping of its settings (an environment
variable's *name* for the key, never a secret).

Every replica keeps its pool in step with this store, so where the store is
shared (Redis) a worker registered through one replica is served by all.
:class:`MemoryWorkerRegistrations` is the single-replica store.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

__all__ = ["WorkerRegistrations", "MemoryWorkerRegistrations"]

Registration = Mapping[str, Any]


class WorkerRegistrations(Protocol):
    """Where registrations live. ``shared``: other replicas see changes (poll ``all``)."""

    shared: bool

    async def add(self, name: str, registration: Registration) -> bool:
        """Store ``registration`` under ``name``; False (and nothing stored) if taken."""
        ...

    async def remove(self, name: str) -> bool:
        """Forget ``name``; False if it was not registered."""
        ...

    async def all(self) -> dict[str, dict[str, Any]]:
        """Every registration, by name."""
        ...


class MemoryWorkerRegistrations:
    """Registrations of this process only."""

    shared = False

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Any]] = {}

    async def add(self, name: str, registration: Registration) -> bool:
        if name in self._items:
            return False
        self._items[name] = dict(registration)
        return True

    async def remove(self, name: str) -> bool:
        return self._items.pop(name, None) is not None

    async def all(self) -> dict[str, dict[str, Any]]:
        return {name: dict(reg) for name, reg in self._items.items()}
