"""Every OpenAI/Anthropic/Google GenAI SDK client a test makes is closed by the test.

An unclosed one leaves its socket to the cyclic garbage collector, whose
ResourceWarning fails whatever test runs when it collects (a CI rehearsal:
``test_sglang_engine.py::test_server_dying_before_ready_raises_with_its_log``
failed on "unclosed <socket.socket ... raddr=('127.0.0.1', 44883)>"; see
tests/support/sdk_clients.py). It is seldom that test's own client, and
which test fails depends on when the collector runs, so a rule on the test
sources finds them all: each client is made

* as the context of a ``with`` (or handed to ``enter_context``);
* handed to ``closed_at_end`` (tests/support/sdk_clients.py);
* assigned to a name that the ``try`` right after it closes in its ``finally``;
* or returned by a factory function (or method) whose every call is one of these.

A pytest fixture that returns a client leaks it: pytest closes nothing a
fixture returns, so a fixture yields the client from inside a ``with``
(a CI run failed ``test_count_tokens_is_the_tokenizers_count`` on the socket
of ``test_local_workers.py``'s fixtures, which returned theirs).

A client on an in-memory transport (``http_client=...(transport=...)``) holds no
socket and is left alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

SDK_CLASSES = {("openai", "OpenAI"), ("openai", "AsyncOpenAI"),
               ("anthropic", "Anthropic"), ("anthropic", "AsyncAnthropic"), ("genai", "Client")}


def _is_sdk_client(call: ast.Call) -> bool:
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and (func.value.id, func.attr) in SDK_CLASSES):
        return False
    return not any(kw.arg == "http_client" and isinstance(kw.value, ast.Call)
                   and any(k.arg == "transport" for k in kw.value.keywords)
                   for kw in call.keywords)


class _Module:
    def __init__(self, path: Path, source: str | None = None) -> None:
        self.path = path.relative_to(REPO)
        self.name = ".".join(self.path.with_suffix("").parts)
        self.tree = ast.parse(path.read_text() if source is None else source, str(path))
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        # names imported from another test module: {local name: (module, name)}
        self.imported = {alias.asname or alias.name: (node.module, alias.name)
                         for node in ast.walk(self.tree) if isinstance(node, ast.ImportFrom)
                         and node.module for alias in node.names}

    def calls(self) -> list[ast.Call]:
        return [node for node in ast.walk(self.tree) if isinstance(node, ast.Call)]

    def function_of(self, node: ast.AST) -> ast.AST | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    def closed(self, call: ast.Call) -> bool:
        """Whether the client ``call`` makes is closed where it is made."""
        up = self.parent.get(call)
        if isinstance(up, ast.withitem) and up.context_expr is call:
            return True
        if isinstance(up, ast.Call) and call in up.args and (
                (isinstance(up.func, ast.Name) and up.func.id == "closed_at_end")
                or (isinstance(up.func, ast.Attribute)
                    and up.func.attr in ("enter_context", "enter_async_context",
                                         "closed_at_end"))):
            return True
        if isinstance(up, ast.Assign) and len(up.targets) == 1 \
                and isinstance(up.targets[0], ast.Name):
            return self._closed_by_next_try(up, up.targets[0].id)
        return False

    def _closed_by_next_try(self, stmt: ast.stmt, name: str) -> bool:
        block = self.parent.get(stmt)
        for field in ("body", "orelse", "finalbody"):
            body = getattr(block, field, None)
            if isinstance(body, list) and stmt in body:
                following = body[body.index(stmt) + 1:]
                break
        else:
            return False
        if not following or not isinstance(following[0], ast.Try):
            return False
        return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr == "close" and isinstance(node.func.value, ast.Name)
                   and node.func.value.id == name
                   for stmt_ in following[0].finalbody for node in ast.walk(stmt_))


def _is_fixture(function: ast.AST) -> bool:
    """Whether ``function`` is decorated ``@pytest.fixture`` / ``@fixture(...)``."""
    for decorator in getattr(function, "decorator_list", []):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name == "fixture":
            return True
    return False


def _modules() -> list[_Module]:
    return [_Module(path) for path in sorted((REPO / "tests").rglob("*.py"))]


def unclosed_clients(modules: list[_Module]) -> list[tuple[str, int, str]]:
    """(path, line, what) of each SDK client (or factory call) that nothing closes."""
    found: list[tuple[str, int, str]] = []
    factories: set[tuple[str, str]] = set()  # (module, function) returning a fresh client
    for module in modules:
        for call in module.calls():
            if not _is_sdk_client(call) or module.closed(call):
                continue
            function = module.function_of(call)
            if isinstance(module.parent.get(call), ast.Return) and function is not None \
                    and not _is_fixture(function):
                factories.add((module.name, function.name))  # its callers must close it
            else:
                found.append((str(module.path), call.lineno, ast.unparse(call.func)))
    for module in modules:
        for call in module.calls():
            if isinstance(call.func, ast.Name):
                name = call.func.id
                origin = module.imported.get(name, (module.name, name))
            elif isinstance(call.func, ast.Attribute):  # a factory method: self.client()
                name = call.func.attr
                origin = (module.name, name)
            else:
                continue
            if origin in factories and not module.closed(call) \
                    and not isinstance(module.parent.get(call), ast.Return):
                found.append((str(module.path), call.lineno, f"{name}()"))
    return sorted(found)


def test_every_sdk_client_a_test_makes_is_closed() -> None:
    unclosed = unclosed_clients(_modules())
    assert not unclosed, "make each in a `with`, or hand it to closed_at_end " \
        "(tests/support/sdk_clients.py): " + ", ".join(
            f"{path}:{line} {what}" for path, line, what in unclosed)


def _lines(source: str) -> list[tuple[int, str]]:
    module = _Module(REPO / "tests" / "unit" / "_probe.py", source)
    return [(line, what) for _path, line, what in unclosed_clients([module])]


def test_the_rule_tells_closed_clients_from_leaked_ones() -> None:
    leaked = '''
import openai, anthropic

def ask(url):
    client = anthropic.Anthropic(base_url=url)
    return client.messages.create()

def make(url):
    return openai.OpenAI(base_url=url)

def test_one(url):
    make(url).models.list()
    openai.OpenAI(base_url=url).models.list()

@pytest.fixture
def oai(url):
    return openai.OpenAI(base_url=url)

class Rig:
    def client(self):
        return openai.OpenAI(base_url=self.url)

def test_two(rig):
    rig.client().models.list()
'''
    assert _lines(leaked) == [(5, "anthropic.Anthropic"), (12, "make()"), (13, "openai.OpenAI"),
                              (17, "openai.OpenAI"), (24, "client()")]
    closed = '''
import contextlib, httpx, openai, anthropic
from tests.support.sdk_clients import closed_at_end

def make(url):
    return openai.OpenAI(base_url=url)

def test_one(url):
    with make(url) as a, anthropic.Anthropic(base_url=url) as b:
        pass
    c = closed_at_end(openai.OpenAI(base_url=url))
    d = openai.OpenAI(base_url=url)
    try:
        d.models.list()
    finally:
        d.close()
    with contextlib.ExitStack() as stack:
        e = stack.enter_context(openai.OpenAI(base_url=url))
    f = openai.OpenAI(http_client=httpx.Client(transport=httpx.MockTransport(None)))

async def test_two(url):
    async with openai.AsyncOpenAI(base_url=url) as g:
        pass

@pytest.fixture
def oai(url):
    with openai.OpenAI(base_url=url) as client:
        yield client

class Rig:
    def client(self):
        return openai.OpenAI(base_url=self.url)

def test_three(rig):
    with rig.client() as client:
        pass
'''
    assert _lines(closed) == []
