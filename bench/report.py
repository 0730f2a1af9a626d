"""bench/run.py's table: direct, the floor and poolgate side by side, and the targets.

The targets of issue 14 (the hot path), since issue 22 for poolgate configured
as users run it (the default log level, so one access line per request; an API
key; the usage ledger in ``state_dir``), judged per row on its rounds pooled
(``bench/run.py`` runs 3 interleaved rounds by default):

- non-stream: poolgate's requests per gateway CPU-second ≥ 0.9 × the floor's on
  ``ns_c16`` and ``msg_c16``, ≥ 0.75 × when poolgate translates (``msg_xl_c16``:
  Anthropic client, OpenAI upstream; the floor cannot translate, so its row is
  the floor forwarding the same request to the upstream's own ``/v1/messages``;
  ``gem_xl_c16``: a Gemini client, the floor sending chat completions);
- streams: poolgate's CPU per stream ≤ 1.2 × the floor's (every SSE scenario);
- open streams (bench/open_streams.py): ≤ 20 KiB RSS per open stream, and a new
  request's TTFT p50 within 5 ms of the floor's under the same load.

"Per core" is per CPU-second of the gateway process (pinned to its own core):
completed requests ÷ gateway CPU seconds, so a busy neighbour slows both
gateways' wall-clock numbers but not this one much.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    kind: str      # "per_core": poolgate÷floor requests per CPU-s ≥ bound; "cpu": CPU ratio ≤ bound
    bound: float


TARGETS: dict[str, Target] = {
    "ns_c16": Target("per_core", 0.9),
    "msg_c16": Target("per_core", 0.9),
    "msg_xl_c16": Target("per_core", 0.75),
    "st_c16": Target("cpu", 1.2),
    "st_c16_d5": Target("cpu", 1.2),
    "msgst_c16": Target("cpu", 1.2),
    "msgst_xl_c16": Target("cpu", 1.2),
    "resst_c16": Target("cpu", 1.2),
    "gem_xl_c16": Target("per_core", 0.75),
    "gemst_xl_c16": Target("cpu", 1.2),
}
OPEN_STREAMS_KIB, OPEN_STREAMS_TTFT_MS = 20.0, 5.0


def fmt(v: float | None, nd: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:,.{nd}f}".replace(",", " ")


def cpu_ms(r: dict) -> float | None:
    """Gateway CPU ms per completed request (None without a gateway or a success)."""
    ok = r.get("ok_requests") or 0
    return r["gateway_cpu_s"] * 1000 / ok if ok and r.get("gateway_cpu_s") else None


def per_core(r: dict) -> float | None:
    ms = cpu_ms(r)
    return 1000 / ms if ms else None


def verdict(name: str, f: dict, p: dict) -> tuple[str, float | None]:
    """('≥ 0.9×' etc., the measured ratio) → the target text with met / missed."""
    target = TARGETS.get(name)
    if target is None:
        return "–", None
    if target.kind == "per_core":
        a, b = per_core(p), per_core(f)
        ratio = a / b if a and b else None
        ok = ratio is not None and ratio >= target.bound
        text = f"≥ {target.bound}×/core"
    else:
        a, b = cpu_ms(p), cpu_ms(f)
        ratio = a / b if a and b else None
        ok = ratio is not None and ratio <= target.bound
        text = f"CPU ≤ {target.bound}×"
    return f"{text}: **{'met' if ok else 'missed'}**", ratio


_SUMMED = ("ok_requests", "requests", "gateway_cpu_s", "upstream_cpu_s", "upstream_seen",
           "errors", "chunk_mismatch")


def _pool_target(runs: list[dict]) -> dict:
    """One target's rounds as one run: counts and CPU summed, rates averaged,
    medians the median of the rounds' medians, foreign load the largest."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[-1])
    for key in _SUMMED:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = round(sum(values), 3)
    for key in ("rps", "chunks_per_s"):
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = sum(values) / len(values)
    for key in ("latency_ms", "ttft_ms"):
        p50s = sorted(r[key]["p50"] for r in runs if (r.get(key) or {}).get("p50") is not None)
        if p50s:
            out[key] = {**(out.get(key) or {}), "p50": p50s[len(p50s) // 2]}
    out["foreign_load"] = max((r.get("foreign_load") or 0.0) for r in runs)
    return out


def pooled(name: str, rounds: list[dict[str, dict]]) -> dict:
    """A scenario's rounds (target -> run, each) as one row's runs, with
    ``round_ratios``: the ratio its target is judged on, round by round."""
    out: dict = {t: _pool_target([r[t] for r in rounds]) for t in rounds[0]}
    out["round_ratios"] = [verdict(name, r.get("floor") or {}, r["poolgate"])[1] for r in rounds]
    if "granian" in rounds[0]:
        out["granian_round_ratios"] = [verdict(name, r.get("floor") or {}, r["granian"])[1]
                                       for r in rounds]
    return out


def _added(k: str, a: dict | None, b: dict | None) -> float | None:
    return b[k] - a[k] if a and b and k in a and k in b else None


def row(name: str, what: str, stream: bool, c: int, r: dict) -> str:
    d, f, p = r["direct"], r.get("floor") or {}, r["poolgate"]
    key = "chunks_per_s" if stream else "rps"
    target, ratio = verdict(name, f, p)
    cpu_ratio = cpu_ms(p) / cpu_ms(f) if cpu_ms(p) and cpu_ms(f) else None
    core_ratio = per_core(p) / per_core(f) if per_core(p) and per_core(f) else None
    fl, pl = f.get("latency_ms"), p.get("latency_ms")
    ttft = _added("p50", f.get("ttft_ms"), p.get("ttft_ms")) if stream else None
    surplus = p.get("upstream_seen", 0) - (p.get("ok_requests") or 0)
    upstream = "ok" if 0 <= surplus <= c else f"{surplus:+d}"
    errors = sum((x.get("errors") or 0) + (x.get("chunk_mismatch") or 0) for x in (d, f, p))
    foreign = max((x.get("foreign_load") or 0.0) for x in (d, f, p))
    del ratio  # shown as the per-core or CPU ratio column it was judged on
    return (f"| `{name}` | {what} | {fmt(d.get(key), 0)} | {fmt(f.get(key), 0)} | "
            f"{fmt(p.get(key), 0)} | {fmt(per_core(f), 0)} | {fmt(per_core(p), 0)} | "
            f"**{fmt(core_ratio, 2)}** | {fmt(cpu_ms(f), 3)} | {fmt(cpu_ms(p), 3)} | "
            f"**{fmt(cpu_ratio, 2)}** | {fmt(_added('p50', fl, pl), 2)} | {fmt(ttft, 2)} | "
            f"{target} | {fmt(foreign, 2)} | {upstream} | {errors} |")


HEAD = ("| scenario | what | direct | floor | poolgate | floor req/core-s | poolgate req/core-s | "
        "÷floor /core | floor CPU ms/req | poolgate CPU ms/req | CPU ÷floor | +p50 vs floor | "
        "+TTFT vs floor | target | foreign load | upstream | errors |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|")

LEGEND = (
    "direct / floor / poolgate = requests/s (non-stream) or content chunks/s (SSE), wall clock; "
    "req/core-s = completed requests per CPU-second of the gateway process (pinned to one core); "
    "CPU ms/req = gateway CPU per request or stream; ÷floor = poolgate ÷ floor; +p50 / +TTFT = "
    "poolgate's median latency / time to first token minus the floor's, ms; target = the bound "
    "for the row (issues 14 and 22: poolgate in its default configuration, access log on); "
    "a row whose what ends in `log_level \"warning\"` (`--quiet`): the same without the access "
    "log; one ending in `server.http \"granian\"` (`--granian`): the same on granian; foreign load = cores kept busy by processes that are not ours "
    "(/proc/stat busy time minus our processes' CPU, ÷ wall time; the largest of the row's three "
    "runs); upstream = `ok` when the upstream saw as many requests as poolgate completed (≤ c "
    "more in flight at the deadline); errors = failed requests + chunk-count mismatches, all "
    "three runs. `_xl_` rows: poolgate translates to the OpenAI upstream, the floor forwards the "
    "same request to the upstream's own `/v1/messages` (it cannot translate); `resst_c16` and "
    "the `gem` rows: direct and floor send chat completions (the upstream has no Responses or "
    "Gemini API).")


def _open_row(target: str, r: dict, floor: dict | None) -> str:
    ttft = (r.get("ttft_open_ms") or {}).get("p50")
    ftt = ((floor or {}).get("ttft_open_ms") or {}).get("p50")
    added = ttft - ftt if ttft is not None and ftt is not None else None
    kib = r.get("kib_per_stream")
    target_text = "–"
    if target == "poolgate":
        met = (kib is not None and kib <= OPEN_STREAMS_KIB and added is not None
               and added <= OPEN_STREAMS_TTFT_MS)
        target_text = f"**{'met' if met else 'missed'}**"
    return (f"| {target} | {r['opened']:,} / {r['n']:,} | {fmt(r.get('ramp_s'), 1)} | "
            f"{r['rss_idle_kib'] / 1024:.1f} → {r['rss_open_kib'] / 1024:.1f} | **{fmt(kib, 1)}** | "
            f"{fmt(r.get('gw_cpu_per_s'), 3)} | {fmt(r.get('tokens_per_s'), 0)} | "
            f"{fmt((r.get('ttft_idle_ms') or {}).get('p50'), 2)} | **{fmt(ttft, 2)}** | "
            f"{fmt(added, 2)} | {fmt(r.get('upstream_kib_per_stream'), 1)} | "
            f"{fmt(r.get('foreign_load'), 2)} | {target_text} |")


def open_streams_table(results: dict[str, dict]) -> str:
    """bench/open_streams.py's results (floor, poolgate) as a markdown table."""
    lines = ["| gateway | open / asked | ramp s | RSS MiB idle → open | KiB per open stream | "
             "gw CPU-s per s, held | tokens/s received | TTFT p50 ms, idle | TTFT p50 ms, open | "
             "+TTFT vs floor | upstream KiB/stream | foreign load | target |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines += [_open_row(t, r, results.get("floor")) for t, r in results.items()]
    return "\n".join(lines) + "\n"
