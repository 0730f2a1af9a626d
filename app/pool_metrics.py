"""Pool metrics read at scrape time from the gateway's own state (workers,
admission, routing, bindings), so the request path pays nothing for them."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pool.worker import WorkerState

__all__ = ["PoolCollector"]


class PoolCollector:
    """A prometheus collector over ``snapshot()`` (see ``Gateway.metrics_snapshot``)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []  # collected lazily: the worker set is known only once the app started

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        states = GaugeMetricFamily("poolgate_worker_state", "1 for the state each worker is in.",
                                   labels=["worker", "state"])
        restarts = CounterMetricFamily("poolgate_worker_restarts", "Worker restarts.",
                                       labels=["worker"])
        probes = GaugeMetricFamily("poolgate_health_probe_seconds",
                                   "Duration of the last health probe.", labels=["worker"])
        looping = GaugeMetricFamily("poolgate_worker_crash_looping",
                                    "1 while a worker fails repeatedly at start.", labels=["worker"])
        for w in snap["workers"]:
            for state in WorkerState:
                states.add_metric([w["name"], state.value], 1.0 if w["state"] == state.value else 0.0)
            restarts.add_metric([w["name"]], float(w["restarts"]))
            looping.add_metric([w["name"]], 1.0 if w["crash_looping"] else 0.0)
            if w["probe_seconds"] is not None:
                probes.add_metric([w["name"]], w["probe_seconds"])
        yield from (states, restarts, probes, looping)

        redis = snap.get("redis", "off")
        if redis != "off":
            yield GaugeMetricFamily("poolgate_redis_up",
                                    "1 while the shared store (Redis) answers, 0 while it is lost.",
                                    value=1.0 if redis == "up" else 0.0)
        yield from _ledger(snap.get("ledger"))
        admission = snap["admission"]
        yield GaugeMetricFamily("poolgate_queue_depth", "Requests waiting for a slot.",
                                value=admission["waiting"])
        yield CounterMetricFamily("poolgate_queue_waits", "Requests that had to wait for a slot.",
                                  value=admission["wait_count"])
        yield CounterMetricFamily("poolgate_queue_wait_seconds",
                                  "Seconds requests spent waiting for a slot.",
                                  value=admission["wait_seconds"])
        rejected = CounterMetricFamily("poolgate_admission_rejections",
                                       "Requests refused for want of a slot, by reason.",
                                       labels=["reason"])
        for reason, count in admission["rejected"].items():
            rejected.add_metric([reason], float(count))
        yield rejected

        routing = CounterMetricFamily("poolgate_routing_decisions",
                                      "Routing outcomes: hits, binds, rebinds, spills, …",
                                      labels=["policy", "outcome"])
        for policy, counts in snap["routing"].items():
            for outcome, count in counts.items():
                routing.add_metric([policy, outcome], float(count))
        yield routing
        matched = CounterMetricFamily("poolgate_prefix_matched_chars",
                                      "Prompt characters routed to a worker holding them "
                                      "(prefix_cache policy).", labels=["policy"])
        blocks = GaugeMetricFamily("poolgate_prefix_blocks",
                                   "Prompt blocks remembered per worker (prefix_cache policy).",
                                   labels=["policy", "worker"])
        for policy, prefix in snap.get("prefix", {}).items():
            matched.add_metric([policy], float(prefix["matched_chars"]))
            for worker, count in prefix["blocks"].items():
                blocks.add_metric([policy, worker], float(count))
        yield from (matched, blocks)
        holds = GaugeMetricFamily("poolgate_slot_hold_seconds",
                                  "Average seconds a request holds its slot (EWMA; sets "
                                  "Retry-After).", labels=["worker"])
        for worker, seconds in admission.get("hold_seconds", {}).items():
            holds.add_metric([worker], seconds)
        yield holds
        yield GaugeMetricFamily("poolgate_session_bindings", "Session bindings held.",
                                value=snap["bindings"].get("items", 0))
        yield from _cli_sessions(snap.get("cli_sessions"))
        yield from _quota(snap.get("quota"))


def _ledger(ledger: dict[str, Any] | None) -> Iterator[Metric]:
    if ledger is None:
        return
    yield GaugeMetricFamily("poolgate_ledger_backlog_rows",
                            "Usage rows answered but not yet in the database (memory and "
                            "the backlog file).", value=float(ledger["backlog"]))
    yield CounterMetricFamily("poolgate_ledger_write_failures",
                              "Failed writes of the usage ledger (retried).",
                              value=float(ledger["failures"]))
    yield CounterMetricFamily("poolgate_ledger_rows_dropped",
                              "Usage rows lost: the database was away past the bound and "
                              "there is no state_dir to spill to.", value=float(ledger["dropped"]))
    yield GaugeMetricFamily("poolgate_database_up",
                            "1 while the ledger's last write succeeded.",
                            value=1.0 if ledger["up"] else 0.0)


def _cli_sessions(cli: dict[str, Any] | None) -> Iterator[Metric]:
    """Upstream session reuse of cli workers: per worker, turns that sent only
    the new turn (hit), opened a new conversation (miss), or resent the
    history (rebuild)."""
    if not cli or not cli["workers"]:
        return
    turns = CounterMetricFamily("poolgate_cli_session_turns",
                                "cli worker turns by upstream session outcome.",
                                labels=["worker", "outcome"])
    for worker, counts in cli["workers"].items():
        for outcome, plural in (("hit", "hits"), ("miss", "misses"), ("rebuild", "rebuilds")):
            turns.add_metric([worker, outcome], float(counts.get(plural, 0)))
    yield turns
    yield GaugeMetricFamily("poolgate_cli_session_entries",
                            "Upstream sessions the gateway's index knows.",
                            value=cli["index"].get("entries", 0))


def _quota(accounts: list[dict[str, Any]] | None) -> Iterator[Metric]:
    """cli accounts' quota (``app.quota_view.quota_metrics``): per window the used
    percent, its reset and when it was last seen; per account the headroom and
    the seconds until the forecast says it runs out (absent when none does)."""
    if not accounts:
        return
    used = GaugeMetricFamily("poolgate_account_quota_used_percent",
                             "Percent of a cli account's quota window used (0 once it reset).",
                             labels=["worker", "window", "source"])
    resets = GaugeMetricFamily("poolgate_account_quota_reset_timestamp_seconds",
                               "When a cli account's quota window resets (Unix time).",
                               labels=["worker", "window"])
    seen = GaugeMetricFamily("poolgate_account_quota_seen_timestamp_seconds",
                             "When a cli account's quota window was last reported (Unix time).",
                             labels=["worker", "window"])
    headroom = GaugeMetricFamily("poolgate_account_quota_headroom_percent",
                                 "Percent left in a cli account's tightest quota window.",
                                 labels=["worker"])
    forecast = GaugeMetricFamily("poolgate_account_quota_forecast_seconds",
                                 "Seconds until a cli account runs out at its current rate "
                                 "(absent when no window is forecast to run out before it "
                                 "resets).", labels=["worker"])
    for account in accounts:
        name = account["worker"]
        for window in account["windows"]:
            used.add_metric([name, window["window"], window["source"]], window["used_percent"])
            if window["resets_at"] is not None:
                resets.add_metric([name, window["window"]], window["resets_at"])
            if window["seen_at"]:
                seen.add_metric([name, window["window"]], window["seen_at"])
        if account["headroom"] is not None:
            headroom.add_metric([name], account["headroom"])
        if account["forecast_seconds"] is not None:
            forecast.add_metric([name], account["forecast_seconds"])
    yield from (used, resets, seen, headroom, forecast)
