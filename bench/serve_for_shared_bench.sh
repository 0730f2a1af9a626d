#!/usr/bin/env bash
# Start poolgate for ../shared/bench/run_bench.sh ("ours"): the runner exports
# BENCH_PORT and BENCH_UPSTREAM_URL; this writes the matching config and serves,
# configured as users run it: the default log level (the access log on), an API
# key, the usage ledger in a state_dir. POOLGATE_BENCH_QUIET=1: log_level = "warning";
# POOLGATE_BENCH_HTTP=granian: server.http = "granian" (default: uvicorn).
#   OURS_CMD="$PWD/bench/serve_for_shared_bench.sh" OURS_API_KEY=sk-bench \
#     ../shared/bench/run_bench.sh --targets floor,ours
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cfg="$(mktemp /tmp/poolgate-bench-XXXXXX.toml)"
state="$(mktemp -d /tmp/poolgate-bench-state-XXXXXX)"
level=""
if [ "${POOLGATE_BENCH_QUIET:-0}" = 1 ]; then level='log_level = "warning"'; fi
http="${POOLGATE_BENCH_HTTP:-uvicorn}"
case "$http" in uvicorn|granian) ;; *) echo "POOLGATE_BENCH_HTTP: uvicorn or granian" >&2; exit 2;; esac
cat >"$cfg" <<TOML
[server]
host = "127.0.0.1"
port = ${BENCH_PORT}
api_keys = { bench = "sk-bench" }
state_dir = "${state}"
${level}
http = "${http}"

[[workers]]
name = "mock-openai"
kind = "remote"
dialect = "openai"
url = "${BENCH_UPSTREAM_URL}/v1"
models = ["mock-gpt", "mock-gpt-d5"]

[[workers]]
name = "mock-anthropic"
kind = "remote"
dialect = "anthropic"
url = "${BENCH_UPSTREAM_URL}"
models = ["mock-claude"]
TOML
# from the checkout itself (not the installed console script), so a worktree benches its own code
cd "$here"
exec "$here/.venv/bin/python" -m app.cli serve --config "$cfg"
