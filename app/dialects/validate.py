"""Field validators shared by the request decoders.

Each validator reads one field of a parsed JSON object and returns it, or
raises :class:`BadRequest` naming the field. The checks are exact ``type()``
tests, and the error text and parameter path are only built on the error path,
so the success path costs a dict lookup and a type test.

The module-level functions word their errors as OpenAI does (``Invalid type
for 'stop[1]': expected a string.``) and report ``param`` (or ``key`` when
``param`` is not given) as the offending field. A dialect that words its
errors differently subclasses :class:`Validators`, overriding the wording
methods and :meth:`Validators.where`, and binds its own instance's methods.
"""

from __future__ import annotations

from typing import Any, Mapping

from pool.errors import BadRequest
from pool.model import ImagePart, Sampling

__all__ = [
    "Validators", "OPENAI",
    "missing", "bad_type", "bad_value", "req_str", "opt_str", "opt_bool", "req_dict",
    "opt_dict", "opt_list", "opt_int", "opt_number", "string_list", "image_url",
    "first_header", "limit_only",
]

_NUMBER = (int, float)


class Validators:
    """The validators, with OpenAI's wording; subclass to word errors another way."""

    __slots__ = ()

    # how expected types are named in ``bad_type`` messages
    STRING = "a string"
    BOOLEAN = "a boolean"
    OBJECT = "an object"
    ARRAY = "an array"
    INTEGER = "an integer"
    NUMBER = "a number"
    STRING_OR_STRINGS = "a string or an array of strings"

    # --- wording (only called on the error path) -----------------------------------

    def missing(self, param: str) -> BadRequest:
        """A required field is absent (or null)."""
        return BadRequest(f"Missing required parameter: '{param}'.", param=param)

    def bad_type(self, param: str, expected: str) -> BadRequest:
        """A field has the wrong JSON type; ``expected`` reads like ``"a string"``."""
        return BadRequest(f"Invalid type for '{param}': expected {expected}.", param=param)

    def bad_value(self, param: str, why: str) -> BadRequest:
        """A field has the right type but an unacceptable value."""
        return BadRequest(f"Invalid value for '{param}': {why}.", param=param)

    def out_of_range(self, low: str, high: str | None) -> str:
        """The ``why`` of a number outside ``[low, high]`` (``high`` None: no upper bound)."""
        return f"must be at least {low}" if high is None else f"must be between {low} and {high}"

    def where(self, param: str | None, key: str) -> str:
        """The reported path of field ``key`` given a validator's ``param`` argument."""
        return param or key

    # --- validators ----------------------------------------------------------------

    def req_str(self, obj: Mapping[str, Any], key: str, param: str | None = None) -> str:
        """``obj[key]``, which must be a string."""
        value = obj.get(key)
        if type(value) is str:
            return value
        if value is None:
            raise self.missing(self.where(param, key))
        raise self.bad_type(self.where(param, key), self.STRING)

    def opt_str(self, obj: Mapping[str, Any], key: str, param: str | None = None) -> str | None:
        """``obj[key]`` if it is a string, ``None`` if absent or null."""
        value = obj.get(key)
        if value is None or type(value) is str:
            return value
        raise self.bad_type(self.where(param, key), self.STRING)

    def opt_bool(self, obj: Mapping[str, Any], key: str, param: str | None = None) -> bool | None:
        """``obj[key]`` if it is a boolean, ``None`` if absent or null."""
        value = obj.get(key)
        if value is None or type(value) is bool:
            return value
        raise self.bad_type(self.where(param, key), self.BOOLEAN)

    def req_dict(self, obj: Mapping[str, Any], key: str,
                 param: str | None = None) -> dict[str, Any]:
        """``obj[key]``, which must be an object."""
        value = obj.get(key)
        if type(value) is dict:
            return value
        if value is None:
            raise self.missing(self.where(param, key))
        raise self.bad_type(self.where(param, key), self.OBJECT)

    def opt_dict(self, obj: Mapping[str, Any], key: str,
                 param: str | None = None) -> dict[str, Any] | None:
        """``obj[key]`` if it is an object, ``None`` if absent or null."""
        value = obj.get(key)
        if value is None or type(value) is dict:
            return value
        raise self.bad_type(self.where(param, key), self.OBJECT)

    def opt_list(self, obj: Mapping[str, Any], key: str,
                 param: str | None = None) -> list[Any] | None:
        """``obj[key]`` if it is an array, ``None`` if absent or null."""
        value = obj.get(key)
        if value is None or type(value) is list:
            return value
        raise self.bad_type(self.where(param, key), self.ARRAY)

    def opt_int(self, obj: Mapping[str, Any], key: str, low: int | None = None,
                high: int | None = None, param: str | None = None) -> int | None:
        """``obj[key]`` as an integer within ``[low, high]`` (either bound optional);
        an integral float (``5.0``, which JSON clients send) counts as an integer."""
        value = obj.get(key)
        if value is None:
            return None
        if type(value) is not int:
            if type(value) is float and value.is_integer():
                value = int(value)
            else:
                raise self.bad_type(self.where(param, key), self.INTEGER)
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.bad_value(self.where(param, key),
                                 self.out_of_range(str(low), None if high is None else str(high)))
        return value

    def opt_number(self, obj: Mapping[str, Any], key: str, low: float, high: float,
                   param: str | None = None) -> float | None:
        """``obj[key]`` as a number within ``[low, high]``, ``None`` if absent or null."""
        value = obj.get(key)
        if value is None:
            return None
        if type(value) not in _NUMBER:
            raise self.bad_type(self.where(param, key), self.NUMBER)
        if not low <= value <= high:
            raise self.bad_value(self.where(param, key), self.out_of_range(f"{low:g}", f"{high:g}"))
        return value

    def string_list(self, value: object, param: str, *, lone: bool = True) -> tuple[str, ...]:
        """An array of strings (``stop``) as a tuple, ``()`` for null; with ``lone`` a
        single string stands for a one-element array."""
        if value is None:
            return ()
        if type(value) is list:
            for k, item in enumerate(value):
                if type(item) is not str:
                    raise self.bad_type(f"{param}[{k}]", self.STRING)
            return tuple(value)
        if lone:
            if type(value) is str:
                return (value,)
            raise self.bad_type(param, self.STRING_OR_STRINGS)
        raise self.bad_type(param, self.ARRAY)

    def image_url(self, url: str, detail: str | None, param: str) -> ImagePart:
        """An image given by an http(s) URL or a base64 ``data:`` URL (``param``: the URL's
        path)."""
        if url.startswith("data:"):
            head, sep, data = url.partition(",")
            if not sep or not head.endswith(";base64"):
                raise self.bad_value(param,
                                     "a data URL must look like data:<media type>;base64,<data>")
            return ImagePart(data=data, media_type=head[5:-7] or None, detail=detail)
        if not url.startswith(("https://", "http://")):
            raise self.bad_value(param, "expected an http(s) URL or a base64 data URL")
        return ImagePart(url=url, detail=detail)


def first_header(headers: Mapping[str, str] | None, names: tuple[str, ...]) -> str | None:
    """The first non-empty value among the (lower-case) header ``names``."""
    if headers:
        for name in names:
            value = headers.get(name)
            if value:
                return value
    return None


OPENAI = Validators()

# OpenAI's wording, as plain names (bound methods cost no more to call than functions)
missing = OPENAI.missing
bad_type = OPENAI.bad_type
bad_value = OPENAI.bad_value
req_str = OPENAI.req_str
opt_str = OPENAI.opt_str
opt_bool = OPENAI.opt_bool
req_dict = OPENAI.req_dict
opt_dict = OPENAI.opt_dict
opt_list = OPENAI.opt_list
opt_int = OPENAI.opt_int
opt_number = OPENAI.opt_number
string_list = OPENAI.string_list
image_url = OPENAI.image_url


# a token limit and nothing else (most requests): one frozen Sampling per limit, shared
_LIMIT_ONLY: dict[int | None, Sampling] = {}


def limit_only(max_tokens: int | None) -> Sampling:
    """``Sampling(max_tokens=max_tokens)``, one shared instance per limit."""
    sampling = _LIMIT_ONLY.get(max_tokens)
    if sampling is None:
        if len(_LIMIT_ONLY) >= 1024:  # clients use a handful; a scanner must not grow it
            _LIMIT_ONLY.clear()
        sampling = _LIMIT_ONLY[max_tokens] = Sampling(max_tokens=max_tokens)
    return sampling
