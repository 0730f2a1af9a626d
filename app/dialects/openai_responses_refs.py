"""``item_reference`` input items of a Responses body: which items they name,
and the body with each replaced by the stored item it names.

The Vercel AI SDK's Responses provider sends earlier assistant output back
this way by default (``{"type": "item_reference", "id": "msg_…"}``); the
route looks the ids up in the stored responses of the caller's key and
hands what it found to :func:`resolve`. Pure: no I/O, no settings.
"""

from __future__ import annotations

from typing import Any, Mapping

from pool.errors import NotFound

from .validate import bad_type

__all__ = ["references", "resolve"]


def references(body: object) -> dict[str, str]:
    """The ids the body's ``item_reference`` input items name, each with the
    parameter of its first mention (``input[3].id``), in order; empty when
    there are none. A reference without a string id is a 400 naming it."""
    value = body.get("input") if type(body) is dict else None
    if type(value) is not list:
        return {}
    found: dict[str, str] = {}
    for k, item in enumerate(value):
        if type(item) is dict and item.get("type") == "item_reference":
            item_id = item.get("id")
            if type(item_id) is not str or not item_id:
                raise bad_type(f"input[{k}].id", "the id of a stored item (a string)")
            found.setdefault(item_id, f"input[{k}].id")
    return found


def resolve(body: dict[str, Any], wanted: Mapping[str, str],
            items: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``body`` (not changed) with a new ``input`` in which each reference is
    the item ``items`` holds for its id; a 404 naming the first id of
    ``wanted`` (from :func:`references`) that ``items`` lacks."""
    for item_id, param in wanted.items():
        if item_id not in items:
            raise NotFound(
                f"Item with id '{item_id}' not found: no response stored with this API key "
                "holds it (it may have expired, been deleted, or been created with "
                "store=false). Send the item itself instead of a reference.",
                param=param, code="item_not_found")
    resolved = [dict(items[item["id"]])
                if type(item) is dict and item.get("type") == "item_reference" else item
                for item in body["input"]]
    return {**body, "input": resolved}
