"""What a cli worker says when its account cannot run, over real worker
children and the fake jsonrpc agent whose errors print its key (as a vendor
may): the reason reaches the operator (``/internal/workers``, the log), the
account's secrets never do."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import wait_for
from tests.support.cli_fakes import fake_cli_worker, serve, worker_info

pytestmark = pytest.mark.slow

SECRET = "plain-account-secret-4d1f"  # no credential shape: only its name marks it


def test_a_refused_start_says_why_without_the_account_s_secret(tmp_path, capfd):
    with FakeUpstream(models=("qwen-coder",)) as upstream:
        worker = fake_cli_worker("jsonrpc", "agent-a", tmp_path / "a", upstream.url,
                                 tmp_path / "a.log", api_key=SECRET,
                                 env={"FAKE_AGENT_FAIL_INITIALIZE": "1", "FAKE_AGENT_LEAKY": "1"})
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            def detail() -> str | None:
                return (worker_info(http)["agent-a"].get("last_exit") or {}).get("detail")

            wait_for(detail, timeout=15)
            info = worker_info(http)["agent-a"]
    assert "bad configuration" in info["last_exit"]["detail"] and info["last_exit"]["code"] == 78
    assert SECRET not in str(info)
    assert SECRET not in "".join(capfd.readouterr())

