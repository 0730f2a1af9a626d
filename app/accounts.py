"""The accounts of cli workers: their state machines (pool/cli/account.py),
and session bundles in and out, at start-up and by the admin API (see
docs/accounts.md).

A bundle is exported only from a worker that is stopped, or drained with
nothing in flight (its CLI must not be refreshing tokens meanwhile), and only
when the account is logged in; it is imported only into a stopped worker
(the account's state machine says which state it is in).
Bundle contents never reach a log line: only their sha256 prefix.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import structlog

from pool.cli.account import Account
from pool.errors import BadRequest, Conflict, NotFound
from sessions.bundles import (BundleError, Manifest, export_bundle, fingerprint, has_credentials,
                              import_bundle)

__all__ = ["Conflict", "AccountConfig", "AccountFiles", "Accounts", "MARKER"]

log = structlog.get_logger("poolgate.accounts")
#: the home's record of the bundle last imported at start-up (its hash, not its contents)
MARKER = ".poolgate-bundle.json"


@dataclass(frozen=True, slots=True)
class AccountConfig:
    """A cli worker's account as configured: where its home is and how it logs in."""

    name: str
    cli: str
    home: str
    bundle: str | None = None
    bundle_b64: str | None = None
    login: Any = None  # LoginSettings or None

    @classmethod
    def from_settings(cls, w: Any) -> AccountConfig:
        b64 = w.bundle_b64.get_secret_value() if w.bundle_b64 is not None else None
        return cls(name=w.name, cli=w.cli, home=os.path.abspath(os.path.expanduser(w.home)),
                   bundle=w.bundle, bundle_b64=b64, login=w.login)


class Accounts:
    """Bundles of every cli worker; logins are in :mod:`app.logins`."""

    def __init__(self, configs: Mapping[str, AccountConfig]) -> None:
        self.configs = dict(configs)
        self.machines: dict[str, Account] = {}

    @classmethod
    def from_settings(cls, settings: Any) -> Accounts:
        return cls({w.name: AccountConfig.from_settings(w)
                    for w in settings.workers if w.kind == "cli"})

    def config(self, name: str) -> AccountConfig:
        try:
            return self.configs[name]
        except KeyError:
            raise NotFound(f"Worker '{name}' is not a cli worker: it has no account.") from None

    # --- start-up ---------------------------------------------------------------------

    async def import_configured(self) -> None:
        """Import each worker's ``bundle`` / ``bundle_env`` before its worker starts.
        A bundle already imported (same hash) is not imported again: the CLI may
        have rotated its tokens since, and the bundle's are then stale."""
        for account in self.configs.values():
            data = self._configured_bundle(account)
            if data is None:
                continue
            digest = fingerprint(data)
            if _marker(account.home) == digest:
                log.info("accounts.bundle_already_imported", worker=account.name, sha256=digest)
                continue
            try:
                manifest = await asyncio.to_thread(import_bundle, data, account.cli, account.home)
            except BundleError as exc:
                raise BadRequest(f"worker {account.name}: the configured bundle is refused: {exc}",
                                 param=f"workers.{account.name}.bundle") from None
            _write_marker(account.home, digest)
            log.info("accounts.bundle_imported", worker=account.name, sha256=digest,
                     source="file" if account.bundle else "env", files=sorted(manifest.files))

    def _configured_bundle(self, account: AccountConfig) -> bytes | None:
        if account.bundle:
            try:
                return Path(account.bundle).read_bytes()
            except OSError as exc:
                raise BadRequest(f"worker {account.name}: cannot read bundle {account.bundle} "
                                 f"({exc.strerror})", param="bundle") from None
        if account.bundle_b64:
            return decode_b64(account.bundle_b64, f"worker {account.name}: bundle_env")
        return None

    # --- the state machines -----------------------------------------------------------

    def attach(self, pool: Any, logins: Any, observer: Any = None) -> None:
        """One :class:`~pool.cli.account.Account` per cli worker: every action on
        an account (admin or automatic) goes through it."""
        for name, config in self.configs.items():
            worker = pool.worker(name)
            spec = worker.cli_spec
            worker.account = self.machines[name] = Account(
                worker, logins, AccountFiles(config, worker), login_timeout=spec.login_timeout,
                probe_interval=spec.login_probe_interval, observer=observer)

    async def aclose(self) -> None:
        """End every login under way (their CLI processes and locks with them)."""
        await asyncio.gather(*(m.aclose() for m in self.machines.values()))

    def account(self, name: str) -> Account:
        self.config(name)
        try:
            return self.machines[name]
        except KeyError:
            raise NotFound(f"Worker '{name}' is not running yet.") from None


class AccountFiles:
    """An account's home as a session bundle (the :class:`~pool.cli.account.BundleFiles`
    its Account uses); the Account has checked the worker's state already."""

    def __init__(self, config: AccountConfig, worker: Any) -> None:
        self.config = config
        self.worker = worker

    async def export(self, info: Mapping[str, Any]) -> bytes:
        account = self.config
        if not has_credentials(account.cli, account.home):
            raise Conflict(f"Worker '{account.name}' is not logged in: there is nothing to export.")
        try:
            data = await asyncio.to_thread(export_bundle, account.cli, account.home,
                                           version=info.get("version"),
                                           account=info.get("account"))
        except BundleError as exc:
            raise Conflict(f"Worker '{account.name}': {exc}.") from None
        log.info("accounts.bundle_exported", worker=account.name, sha256=fingerprint(data))
        return data

    async def import_(self, data: bytes) -> Manifest:
        account = self.config
        try:
            manifest = await asyncio.to_thread(import_bundle, data, account.cli, account.home)
        except BundleError as exc:
            raise BadRequest(f"The bundle is refused: {exc}.", param="bundle") from None
        log.info("accounts.bundle_imported", worker=account.name, sha256=fingerprint(data),
                 source="admin", files=sorted(manifest.files))
        return manifest


def decode_b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what} is not valid base64.", param="bundle") from None


def _marker(home: str) -> str | None:
    try:
        return str(json.loads(Path(home, MARKER).read_text())["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_marker(home: str, digest: str) -> None:
    path = Path(home, MARKER)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"sha256": digest}, fh)
