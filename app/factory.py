"""``create_app(settings)``: everything the app needs is passed in here."""

from __future__ import annotations

import asyncio
import contextlib
import os
from functools import partial
from typing import Any, AsyncIterator, Mapping

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from auth.keys import KeyRing, TokenGate
from pool.errors import GatewayError, NotFound
from pool.admission import AdmissionGuard
from pool.pool import Pool
from pool.local.defaults import find_default_model
from pool.childenv import child_environment, proxy_environment
from pool.cli.sandbox import resolve_sandbox
from pool.cli.counted import CountedWindow
from pool.cli.worker import CliSpec, CliWorker
from pool.dumpable import undumpable
from pool.local.worker import LocalSpec, LocalWorker
from pool.process import ProcessSpec, ProcessWorker
from pool.headroom import QuotaRouting
from pool.routing import make_policy
from pool.supervisor import SupervisorPolicy
from pool.remote import RemoteSpec, make_remote_worker
from pool.remote.lean_check import self_test as lean_self_test
from pool.remote.policy import PassPolicy
from sessions.alert_claims import RedisAlertClaims

from .accounts import Accounts
from .alerts import AccountAlerts, Alerts
from .quota_alerts import QuotaAlerts
from .gateway import Gateway
from .hot import GatewayApp, HotRoute, hot_table, unhandled
from .logins import Logins
from .http import error_response
from .middleware import GatewayMiddleware
from .observability import Metrics
from .pool_metrics import PoolCollector
from .replicas import Drains, build_stores
from .runtime_workers import RuntimeWorkers
from .routes import (accounts as account_routes, chat, gemini, keys as key_routes, models, ops,
                     responses, worker_admin)
from .routes.ui import UI_PATH, UI_STATIC_PATH, OperatorPage
from .worker_settings import EMBEDDED_SAMPLING
from .state import apply_policy, open_state, rebuild_budgets
from .teams import Teams, policy_from_settings

__all__ = ["create_app", "worker_specs", "remote_spec"]

log = structlog.get_logger("poolgate")

DEMO_MODELS = {"openai": ("demo",), "anthropic": ("demo-claude",)}
#: seconds between re-reads of the ledger's budget totals while Redis is down
#: (a shared database: what the other replicas charged meanwhile)
BUDGET_RESEED = 2.0


def _secret(value: Any) -> str | None:
    if value is None:
        return None
    getter = getattr(value, "get_secret_value", None)
    text = getter() if getter is not None else str(value)
    return text or None


Spec = RemoteSpec | ProcessSpec | LocalSpec | CliSpec


def worker_specs(settings: Any, *, lean: bool = True) -> list[Spec]:
    """The worker specs the configuration asks for, in order (``lean``: see
    :attr:`RemoteSpec.lean`)."""
    specs: list[Spec] = []
    for w in settings.workers:
        if w.kind == "local":
            specs.append(local_spec(w, settings))
        elif w.kind == "cli":
            specs.append(cli_spec(w, settings.environment))
        elif w.kind == "process":
            specs.append(ProcessSpec(
                name=w.name, command=tuple(w.command), models=tuple(w.models),
                aliases=dict(w.aliases), capacity=w.max_in_flight, env=dict(w.env),
                env_passthrough=tuple(w.env_passthrough), cwd=w.cwd,
                ready_timeout=w.ready_timeout or 30.0, health_interval=w.health_interval,
                health_timeout=w.health_timeout, backoff_initial=w.backoff_initial,
                backoff_max=w.backoff_max, crash_loop_threshold=w.crash_loop_threshold,
                crash_loop_window=w.crash_loop_window, stop_timeout=w.stop_timeout))
        else:
            specs.append(remote_spec(w, lean=lean))
    return specs


def remote_spec(w: Any, *, lean: bool = True) -> RemoteSpec:
    """A ``remote`` worker's spec from its settings (configured or registered at run time)."""
    return RemoteSpec(
        name=w.name, dialect=w.dialect, url=w.url, api_key=_secret(w.api_key),
        models=tuple(w.models), aliases=dict(w.aliases),
        connect_timeout=w.connect_timeout, first_byte_timeout=w.first_byte_timeout,
        idle_timeout=w.idle_timeout, max_connections=w.max_connections,
        max_in_flight=w.max_in_flight, policy=pass_policy(w), lean=lean,
        proxy=_secret(w.proxy))


def pass_policy(w: Any) -> PassPolicy:
    return PassPolicy(pass_fields=frozenset(w.pass_fields), pass_betas=frozenset(w.pass_betas),
                      server_tools=frozenset(w.server_tools), image_urls=w.image_urls,
                      image_max_bytes=w.image_max_bytes)


def local_spec(w: Any, settings: Any) -> LocalSpec:
    model = w.model
    sampling = w.sampling_defaults
    if model is None:  # the embedded default (llamacpp only; settings checked that)
        model = find_default_model(os.path.expanduser(settings.server.cache_dir))
        sampling = sampling or EMBEDDED_SAMPLING
    template = None
    if w.chat_template is not None:
        with open(w.chat_template, encoding="utf-8") as fh:
            template = fh.read()
    return LocalSpec(
        name=w.name, engine=w.engine, model=model, models=tuple(w.models), aliases=dict(w.aliases),
        context_length=w.context_length, capacity=w.capacity, max_in_flight=w.max_in_flight,
        threads=w.threads, gpu_ids=w.gpu_ids, engine_args=dict(w.engine_args),
        chat_template=template, python=w.python, env=dict(w.env),
        env_passthrough=tuple(w.env_passthrough),
        sampling_defaults=sampling.model_dump(exclude_none=True) if sampling else {},
        ready_timeout=w.ready_timeout or 600.0, health_interval=w.health_interval,
        health_timeout=w.health_timeout, stop_timeout=w.stop_timeout,
        call_timeout=w.call_timeout, read_timeout=w.read_timeout)


def cli_spec(w: Any, environment: Mapping[str, str]) -> CliSpec:
    """A cli worker's spec, its CLI's environment built from ``environment`` (the
    one settings read, never this process's own: an empty one stays empty); in
    agent mode its sandbox is resolved here, so a machine that cannot give it
    refuses the worker (:class:`SandboxUnavailable`)."""
    # the egress proxy last: no variable of the worker's env routes around it
    env = {**w.env, **{name: _secret(value) or "" for name, value in w.env_secrets.items()},
           **proxy_environment(_secret(w.proxy))}
    cli_env = {**child_environment(environment, w.env_passthrough), **env}
    sandbox = resolve_sandbox(w.sandbox, name=w.name, mode=w.mode, cli=w.cli, home=w.home,
                              env=cli_env, command=tuple(w.command), paths=w.sandbox_paths,
                              options=w.cli_options)
    return CliSpec(
        name=w.name, cli=w.cli, models=tuple(w.models), home=w.home, aliases=dict(w.aliases),
        command=tuple(w.command), env=env, env_passthrough=tuple(w.env_passthrough),
        mode=w.mode, max_conversations=w.max_conversations,
        options=dict(w.cli_options), tool_timeout=w.tool_timeout,
        conversation_idle=w.conversation_idle, idle_timeout=w.idle_timeout,
        sandbox=sandbox, workspace_root=w.workspace_root,
        login_timeout=w.login_timeout, login_probe_interval=w.login_probe_interval,
        proxy=_secret(w.proxy), quota_reserve=w.quota_reserve,
        quota_windows=tuple(CountedWindow(q.name, q.seconds, q.tokens) for q in w.quota_windows),
        supervision=SupervisorPolicy(
            ready_timeout=w.ready_timeout or 30.0, health_interval=w.health_interval,
            health_timeout=w.health_timeout, backoff_initial=w.backoff_initial,
            backoff_max=w.backoff_max, crash_loop_threshold=w.crash_loop_threshold,
            crash_loop_window=w.crash_loop_window, stop_timeout=w.stop_timeout))


def make_worker(spec: Spec, environment: Mapping[str, str], sessions: Any = None) -> Any:
    """A worker for ``spec``; a process worker's child inherits ``environment``;
    a cli worker keeps ``sessions`` (the upstream session index) up to date."""
    if isinstance(spec, CliSpec):
        return CliWorker(spec, base_env=environment, sessions=sessions)
    if isinstance(spec, LocalSpec):
        return LocalWorker(spec, base_env=environment)
    if isinstance(spec, ProcessSpec):
        return ProcessWorker(spec, base_env=environment)
    return make_remote_worker(spec)


def create_app(settings: Any) -> Starlette:
    server = settings.server
    secrets = {name: _secret(key) or "" for name, key in server.api_keys.items()}
    secrets.update((name, _secret(key.secret) or "") for name, key in server.keys.items())
    keys = KeyRing(secrets)
    stores = build_stores(settings)
    gw = Gateway(settings=settings, metrics=Metrics(),
                 admin=TokenGate(_secret(server.admin_token)),
                 metrics_gate=TokenGate(_secret(server.metrics_token)),
                 metrics_public=server.metrics_public, max_body_bytes=server.max_body_bytes,
                 responses=stores.responses,
                 admission=AdmissionGuard(global_limit=server.max_in_flight or None,
                                          per_key_limit=server.max_in_flight_per_key or None,
                                          max_wait=server.queue_timeout),
                 bindings=stores.bindings, cli_sessions=stores.cli_sessions,
                 signatures=stores.signatures,
                 redis=stores.link, locks=stores.locks, drains=Drains(stores.drained),
                 cooldown_seconds=settings.routing.cooldown_seconds,
                 quota=quota_routing(settings),
                 log_requests=server.log_level in ("debug", "info"),
                 stream_grace=server.stream_grace, ping_interval=server.ping_interval,
                 keyring=keys, config_keys=frozenset(secrets),
                 teams=Teams((), stores.limits, slots=stores.slots,
                             max_wait=server.queue_timeout))
    for name, key in server.keys.items():
        apply_policy(gw, policy_from_settings(name, key))
    _build_policies(gw, settings.routing)
    gw.metrics.registry.register(PoolCollector(gw.metrics_snapshot))
    gw.accounts = Accounts.from_settings(settings)
    gw.logins = Logins(gw.accounts, gw.metrics.registry, settings.environment, locks=gw.locks)
    alerts = Alerts(settings.alerts, gw.metrics.registry)
    if stores.link is not None:  # budgets are shared: one replica sends their alerts
        alerts.claims = RedisAlertClaims(stores.link)
    gw.logins.alerts = gw.teams.alerts = alerts

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # no process of our user reads our environment (the admin token, upstream
        # keys) through /proc, nor attaches to us: agent-mode tools run as that user
        undumpable()
        async with contextlib.AsyncExitStack() as stack:
            if gw.redis is not None:
                await _start_redis(gw, stack)
            await open_state(gw, server.state_dir, stack, _secret(server.database_url))
            await gw.accounts.import_configured()  # bundles land before the CLIs start
            gw.remote_lean = await _remote_swap_checked()
            # in a thread: finding the default model may download it (blocking urlopen)
            specs = await asyncio.to_thread(worker_specs, settings, lean=gw.remote_lean)
            if not specs and settings.server.demo:
                specs = await _start_demo(stack)
            gw.pool = Pool([make_worker(spec, settings.environment, gw.cli_sessions)
                            for spec in specs],
                           default_model=settings.routing.default_model)
            gw.logins.pool = gw.pool
            gw.accounts.attach(gw.pool, gw.logins, AccountAlerts(alerts))
            await gw.pool.start()
            stack.push_async_callback(gw.pool.aclose)
            stack.push_async_callback(gw.accounts.aclose)
            watcher = asyncio.ensure_future(gw.logins.watch())
            stack.callback(watcher.cancel)
            if alerts.receivers:  # posted by their own tasks, never on a request's path
                alerts.start()
                stack.push_async_callback(alerts.aclose)
                crashes = asyncio.ensure_future(alerts.watch_workers(lambda: gw.pool.workers))
                stack.callback(crashes.cancel)
                quota_alerts = QuotaAlerts(alerts)
                if quota_alerts.wanted():
                    quota = asyncio.ensure_future(quota_alerts.watch(lambda: gw.pool.workers))
                    stack.callback(quota.cancel)
            await _open_runtime_workers(gw, settings, stores.workers, stack)
            probes = asyncio.ensure_future(gw.pool.probe_forever(server.health_interval))
            stack.callback(probes.cancel)
            log.info("gateway.started", workers=[s.name for s in specs],
                     models=[m.id for m in gw.pool.models()])
            yield

    operator_page = OperatorPage()
    # dispatched by the middleware past the router (see app.hot); on the router
    # too, so another method on their paths gets its 405
    hot = [HotRoute(gw, "POST", path, handler) for path, handler in (
        ("/v1/chat/completions", chat.chat_completions),
        ("/v1/messages", chat.messages),
        ("/v1/messages/count_tokens", chat.count_tokens),
        ("/v1/completions", chat.completions),
        ("/generate", chat.generate),
        ("/v1/responses", responses.create_response),
    )]
    routes = [
        *(Route(r.path, r, methods=[r.method], name=r.handler.__name__) for r in hot),
        # Gemini methods (the model in the path) are dispatched by the middleware only
        Route("/v1beta/models", gemini.list_models, methods=["GET"]),
        Route("/v1beta/models/{model_id:path}", gemini.get_model, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", responses.list_input_items,
              methods=["GET"]),
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", models.get_model, methods=["GET"]),
        Route("/", ops.root, methods=["GET", "HEAD"]),
        Route("/healthz", ops.healthz, methods=["GET"]),
        Route("/readyz", ops.readyz, methods=["GET"]),
        Route("/metrics", ops.metrics, methods=["GET"]),
        Route("/internal/workers", ops.internal_workers, methods=["GET"]),
        Route("/internal/workers", worker_admin.register_worker, methods=["POST"]),
        Route("/internal/workers/{name}", worker_admin.unregister_worker, methods=["DELETE"]),
        Route("/internal/workers/{name}/engine", ops.worker_engine, methods=["GET"]),
        Route("/internal/workers/{name}/bundle", account_routes.get_bundle, methods=["GET"]),
        Route("/internal/workers/{name}/bundle", account_routes.put_bundle, methods=["PUT"]),
        Route("/internal/workers/{name}/login", account_routes.login_status, methods=["GET"]),
        Route("/internal/workers/{name}/login", account_routes.start_login, methods=["POST"]),
        Route("/internal/workers/{name}/login", account_routes.cancel_login, methods=["DELETE"]),
        Route("/internal/workers/{name}/login/code", account_routes.login_code,
              methods=["POST"]),
        Route("/internal/workers/{name}/login/screenshot", account_routes.login_screenshot,
              methods=["GET"]),
        Route("/internal/auto-login/start", account_routes.auto_login_start, methods=["POST"]),
        Route("/internal/auto-login/status", account_routes.auto_login_status, methods=["GET"]),
        Route("/internal/session/export", account_routes.session_export, methods=["POST"]),
        Route("/internal/workers/{name}/{action}", ops.worker_action, methods=["POST"]),
        Route("/internal/stats", ops.internal_stats, methods=["GET"]),
        Route("/internal/accounts", account_routes.list_accounts, methods=["GET"]),
        Route("/internal/usage", key_routes.usage, methods=["GET"]),
        Route("/internal/keys", key_routes.list_keys, methods=["GET"]),
        Route("/internal/keys", key_routes.create_key, methods=["POST"]),
        Route("/internal/keys/{name}", key_routes.update_key, methods=["PATCH"]),
        Route("/internal/keys/{name}", key_routes.delete_key, methods=["DELETE"]),
        # public: static files with no data; the JSON they call checks the admin token
        Route(UI_PATH, operator_page.page, methods=["GET", "HEAD"]),
        Route(UI_STATIC_PATH, operator_page.asset, methods=["GET", "HEAD"]),
    ]
    table = hot_table([*hot, *gemini.hot_routes(gw)])

    def front(app: Any) -> GatewayMiddleware:
        return GatewayMiddleware(app, keys=keys, max_body_bytes=server.max_body_bytes,
                                 on_finish=gw.finish, admin=gw.admin, metrics=gw.metrics_gate,
                                 metrics_public=gw.metrics_public, hot=table)

    app = GatewayApp(
        front=front,
        routes=routes,
        exception_handlers={HTTPException: _http_exception, Exception: _unhandled},
        lifespan=lifespan,
    )
    app.state.gateway = gw
    return app


async def _open_runtime_workers(gw: Gateway, settings: Any, registrations: Any,
                                stack: contextlib.AsyncExitStack) -> None:
    """Remote workers registered at run time, kept in step with their store
    (Redis: polled with the link's health probe, see ``_start_redis``)."""
    def make(worker: Any) -> Any:
        return make_remote_worker(remote_spec(worker, lean=gw.remote_lean))

    runtime = RuntimeWorkers(gw, registrations, environ=settings.environment, make=make,
                             secret_envs=settings.server.runtime_secret_envs)
    gw.runtime_workers = runtime
    stack.push_async_callback(runtime.aclose)
    await runtime.sync()  # what other replicas registered before this one started


async def _start_redis(gw: Gateway, stack: contextlib.AsyncExitStack) -> None:
    """First ping, then the probe loop (which also syncs drains); a Redis down
    at start-up is not fatal: the replica serves from memory until it answers."""
    link = gw.redis
    stack.push_async_callback(link.aclose)
    stack.push_async_callback(gw.teams.limits.aclose)  # leases back, charges sent; then close
    stack.push_async_callback(gw.signatures.aclose)  # the notes still being written
    if not await link.ping():
        log.warning("gateway.redis_unreachable")

    outages = link.outages
    limits, slots = gw.teams.limits, gw.teams.slots
    if slots is not None:
        stack.push_async_callback(slots.aclose)

    async def tick() -> None:
        nonlocal outages
        lost = link.outages != outages
        if lost:  # back after an outage
            outages = link.outages
            gw.drains.republish()
        elif await limits.lost():  # flushed, or restarted empty, between two probes
            log.warning("gateway.redis_lost_limits")
            lost = True
        if slots is not None:
            await slots.beat(republish=lost)  # this replica's slots stay counted
        if lost:  # charges made meanwhile reached only this replica; or Redis has none
            await rebuild_budgets(gw)
        if gw.runtime_workers is not None:
            await gw.runtime_workers.sync()  # workers registered through other replicas
        if gw.pool.workers:
            await gw.drains.sync(gw)

    # while Redis is down the shared ledger is how a replica learns the others' charges
    watch = asyncio.ensure_future(link.watch(tick, on_down=partial(rebuild_budgets, gw),
                                             down_every=BUDGET_RESEED))
    stack.callback(watch.cancel)


async def _start_demo(stack: contextlib.AsyncExitStack) -> list[RemoteSpec]:
    """No workers configured: serve the embedded demo upstream, offline."""
    from .demo_upstream import start_demo_upstream

    demo = await start_demo_upstream()
    stack.push_async_callback(demo.close)
    log.info("gateway.demo_upstream", port=demo.port)
    return [RemoteSpec(name="demo-openai", dialect="openai", url=demo.openai_url,
                       models=DEMO_MODELS["openai"]),
            RemoteSpec(name="demo-anthropic", dialect="anthropic", url=demo.anthropic_url,
                       models=DEMO_MODELS["anthropic"])]


def _dialect(request: Request) -> str:
    record = request.scope.get("state", {}).get("record")
    return record.error_dialect() if record is not None else "openai"


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err: GatewayError = NotFound(f"No such endpoint: {request.method} {request.url.path}.")
    else:
        err = GatewayError(f"{request.method} is not allowed on {request.url.path}.",
                           status=exc.status_code)
        err.kind = "invalid_request"
    return error_response(err, _dialect(request), dict(exc.headers or {}))


async def _remote_swap_checked() -> bool:
    """Whether remote workers make their streamed responses lean: only if the
    swap's self-test passes on this aiohttp (``remote.swap`` on or off)."""
    failure = await lean_self_test()
    if failure is None:
        log.info("remote.swap", state="on")
        return True
    log.warning("remote.swap", state="off", reason=failure)
    return False


async def _unhandled(request: Request, exc: Exception) -> Response:
    return unhandled(exc, _dialect(request))


def quota_routing(settings: Any) -> QuotaRouting:
    """``[routing]``'s quota rules for cli accounts, the reserves keyed by the
    served model (an alias in the configuration means its model)."""
    reserves: dict[str, float] = {}
    for name, percent in settings.routing.quota_reserve.items():
        model = next((m for w in settings.workers if (m := w.resolve(name)) is not None), name)
        reserves[model] = percent
    return QuotaRouting(reserves=reserves, by_headroom=settings.routing.quota_routing)


def _build_policies(gw: Gateway, routing: Any) -> None:
    """The default routing policy and any per-model ones, all sharing one
    binding store (its keys carry the model)."""
    def busy(name: str) -> bool:
        worker = next((w for w in gw.pool.workers if w.name == name), None)
        return worker is not None and gw.admission.in_flight(name) >= worker.capacity

    def policy(name: str) -> Any:
        return make_policy(name, in_flight=gw.admission.in_flight, store=gw.bindings,
                           ttl=routing.binding_ttl, busy=busy, imbalance_abs=routing.imbalance_abs,
                           imbalance_rel=routing.imbalance_rel, owned=True,
                           prefix={"block_chars": routing.prefix_block_chars,
                                   "min_match": routing.prefix_min_match,
                                   "max_blocks": routing.prefix_max_blocks,
                                   "max_age": routing.prefix_max_age})

    gw.policy = policy(routing.policy)
    gw.policies = {model: policy(name) for model, name in routing.models.items()}
