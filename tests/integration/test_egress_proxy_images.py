"""``image_urls = "fetch"`` on a remote worker with ``proxy``: the gateway
fetches a client's image URL through the worker's egress proxy (HTTP or
SOCKS5), never direct, and still refuses loopback and private addresses.
A real gateway, the OpenAI SDK, a fake upstream, a real image server and a
real logging proxy whose own DNS knows the image host (the gateway's does not)."""

from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.egress_proxy import EgressProxy
from tests.fakes.upstreams import FakeUpstream
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

KEY = "sk-upstream-key-images-0123"
GATEWAY_KEY = "sk-poolgate-images"
PROXY_PASSWORD = "proxy-password-images-2468"
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA"
                       "hKmMIQAAAABJRU5ErkJggg==")
IMAGE_HOST = "images.egress.test"  # .test: never resolves here; the proxy's DNS knows it


class _Images(BaseHTTPRequestHandler):
    seen: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("content-type", "image/png")
        self.send_header("content-length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)


@pytest.fixture
def images() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _chat(srv: ServerThread, url: str) -> Any:
    client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key=GATEWAY_KEY,
                                         max_retries=0))
    return client.chat.completions.create(model="gpt-fetch", messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": url}}]}])


@pytest.mark.parametrize("kind", ["http", "socks5"])
def test_an_image_url_is_fetched_through_the_workers_proxy(images: ThreadingHTTPServer,
                                                           kind: str) -> None:
    port = images.server_address[1]
    with FakeUpstream(api_key=KEY) as upstream, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}",
                        hosts={IMAGE_HOST: "127.0.0.1"}) as proxy:
        worker = WorkerSettings(name="oai-fetch", kind="remote", dialect="openai",
                                url=upstream.url, models=("gpt-fetch",), api_key=KEY,
                                image_urls="fetch",
                                proxy=proxy.url if kind == "http" else proxy.socks_url)
        settings = Settings(server=ServerSettings(api_keys={"team": GATEWAY_KEY}),
                            workers=(worker,))
        with ServerThread(create_app(settings)) as srv:
            answer = _chat(srv, f"http://{IMAGE_HOST}:{port}/cat.png")
            assert answer.choices[0].message.content.startswith("echo:")
            sent = str(upstream.last.body["messages"])
            assert base64.b64encode(PNG).decode() in sent and IMAGE_HOST not in sent
            assert f"{IMAGE_HOST}:{port}" in proxy.targets()  # fetched through the proxy
            assert _Images.seen[-1] == "/cat.png"
            fetched = len(_Images.seen)
            for target in (f"http://127.0.0.1:{port}/x.png", f"http://localhost:{port}/x.png"):
                with pytest.raises(openai.BadRequestError) as refused:
                    _chat(srv, target)
                assert "private or loopback" in refused.value.message
                assert PROXY_PASSWORD not in refused.value.response.text
            assert len(_Images.seen) == fetched  # neither through the proxy nor around it
            proxy.stop()  # down: the fetch fails, it does not go direct
            with pytest.raises(openai.BadRequestError) as failed:
                _chat(srv, f"http://{IMAGE_HOST}:{port}/dog.png")
            assert PROXY_PASSWORD not in failed.value.response.text
            assert len(_Images.seen) == fetched
