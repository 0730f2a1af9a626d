"""Login recipes: how to get through one identity provider's pages, as data.

A recipe is a TOML or JSON file an operator can add (docs/accounts.md has the
format and an example); nothing about a provider lives in code. It names the
steps (fill, click, wait for, press), the failure marker and the texts that
mean a wrong password (no retry), what success looks like (a URL pattern or a
selector), and where the code is (the final URL's query, a page element, or
nowhere when the provider redirects to the CLI's own listener).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["Step", "Recipe", "RecipeError", "load_recipe", "parse_recipe", "PLACEHOLDERS"]

PLACEHOLDERS = ("{username}", "{password}", "{totp}")
_ACTIONS = ("goto", "fill", "click", "press", "wait_for")


class RecipeError(ValueError):
    """The recipe file is unusable; the message names the key."""


@dataclass(frozen=True, slots=True)
class Step:
    action: Literal["goto", "fill", "click", "press", "wait_for"]
    target: str  # a selector, or a URL for goto
    value: str | None = None  # fill: the text (placeholders allowed); press: the key
    optional: bool = False  # skip when the selector matches nothing (a consent page seen once)


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    steps: tuple[Step, ...]
    failure_selector: str | None = None
    wrong_password_texts: tuple[str, ...] = ()
    success_url: re.Pattern[str] | None = None
    success_selector: str | None = None
    code_from: Literal["url", "text", "none"] = "none"
    code_param: str = "code"
    state_param: str | None = None
    code_format: str = "{code}"
    code_selector: str | None = None
    user_agent: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def needs_totp(self) -> bool:
        return any(s.value and "{totp}" in s.value for s in self.steps)


def load_recipe(path: str | Path) -> Recipe:
    """A recipe from a ``.toml`` or ``.json`` file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(f"cannot read recipe {path} ({exc.strerror})") from None
    try:
        data = tomllib.loads(raw.decode()) if path.suffix != ".json" else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecipeError(f"recipe {path} is not valid {path.suffix.lstrip('.') or 'toml'}: "
                          f"{exc}") from None
    return parse_recipe(data, default_name=path.stem)


def parse_recipe(data: Any, default_name: str = "recipe") -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError("a recipe is a table")
    steps = tuple(_step(i, s) for i, s in enumerate(data.get("steps") or []))
    if not steps:
        raise RecipeError("steps: a recipe needs at least one step")
    failure = _table(data, "failure")
    success = _table(data, "success")
    code = _table(data, "code")
    if not success.get("url") and not success.get("selector"):
        raise RecipeError("success: give url (a regular expression) or selector")
    try:
        success_url = re.compile(success["url"]) if success.get("url") else None
    except re.error as exc:
        raise RecipeError(f"success.url is not a regular expression: {exc}") from None
    code_from = code.get("from", "none")
    if code_from not in ("url", "text", "none"):
        raise RecipeError("code.from must be url, text or none")
    if code_from == "text" and not code.get("selector"):
        raise RecipeError("code.selector: needed when code.from is text")
    return Recipe(
        name=str(data.get("name") or default_name), steps=steps,
        failure_selector=failure.get("selector"),
        wrong_password_texts=tuple(failure.get("wrong_password_texts") or ()),
        success_url=success_url, success_selector=success.get("selector"),
        code_from=code_from, code_param=str(code.get("param", "code")),
        state_param=code.get("state_param"), code_format=str(code.get("format", "{code}")),
        code_selector=code.get("selector"), user_agent=data.get("user_agent"))


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise RecipeError(f"{key}: must be a table")
    return value


def _step(index: int, raw: Any) -> Step:
    where = f"steps[{index}]"
    if not isinstance(raw, dict):
        raise RecipeError(f"{where}: must be a table")
    actions = [a for a in _ACTIONS if a in raw]
    if len(actions) != 1:
        raise RecipeError(f"{where}: give exactly one of {', '.join(_ACTIONS)}")
    action = actions[0]
    target = raw[action]
    if not isinstance(target, str) or not target:
        raise RecipeError(f"{where}.{action}: must be a non-empty string")
    value = raw.get("value", raw.get("key"))
    if action in ("fill", "press") and not isinstance(value, str):
        raise RecipeError(f"{where}.value: {action} needs a value")
    return Step(action=action, target=target, value=value, optional=bool(raw.get("optional")))
