"""GGUF metadata, read without the ``gguf`` package (not a runtime dependency)
and without touching the tensors: what the ``llamacpp`` engine needs of a model
file (vocabulary, token types, special ids, chat template, context length)."""

from __future__ import annotations

import array
import mmap
import struct
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

__all__ = ["GGUFMetadata", "read_gguf_metadata", "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED",
           "UNUSED", "BYTE"]

# token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str, *, skip: Iterable[str] = ("tokenizer.ggml.merges",
                                                            "tokenizer.ggml.scores")) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (v2/v3, either byte order), without
    its tensors. Strings are ``str`` (undecodable bytes kept as surrogates),
    arrays lists (numeric arrays ``array.array``); keys in ``skip`` are left out
    (read past, not decoded)."""
    skipped = frozenset(skip)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        order = "<"
        (version,) = struct.unpack_from("<I", mm, 4)
        if version & 0xFFFF == 0:  # written big-endian
            order = ">"
            (version,) = struct.unpack_from(">I", mm, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        _n_tensors, n_kv = struct.unpack_from(order + "QQ", mm, 8)
        reader = _GGUFReader(mm, 24, order)
        out: dict[str, Any] = {}
        for _ in range(n_kv):
            key = reader.string()
            kind = reader.u32()
            if key in skipped:
                reader.skip(kind)
            else:
                out[key] = reader.value(kind)
        return out


class _GGUFReader:
    __slots__ = ("mm", "off", "order")

    def __init__(self, mm: mmap.mmap, off: int, order: str) -> None:
        self.mm, self.off, self.order = mm, off, order

    def u32(self) -> int:
        (v,) = struct.unpack_from(self.order + "I", self.mm, self.off)
        self.off += 4
        return int(v)

    def u64(self) -> int:
        (v,) = struct.unpack_from(self.order + "Q", self.mm, self.off)
        self.off += 8
        return int(v)

    def string(self) -> str:
        n = self.u64()
        raw = self.mm[self.off:self.off + n]
        self.off += n
        return raw.decode("utf-8", "surrogateescape")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.u32(), self.u64()
            if item == _STRING:
                return [self.string() for _ in range(n)]
            if item in _SCALAR:
                code = _SCALAR[item]
                size = struct.calcsize(code)
                raw = self.mm[self.off:self.off + n * size]
                self.off += n * size
                if code == "?":
                    return [b != 0 for b in raw]
                values = array.array(_ARRAY_CODE[code], raw)
                if (self.order == ">") != (sys.byteorder == "big"):
                    values.byteswap()
                return values
            return [self.value(item) for _ in range(n)]
        code = _SCALAR.get(kind)
        if code is None:
            raise ValueError(f"unknown GGUF value type {kind}")
        (v,) = struct.unpack_from(self.order + code, self.mm, self.off)
        self.off += struct.calcsize(code)
        return v

    def skip(self, kind: int) -> None:
        if kind == _STRING:
            n = self.u64()
            self.off += n
        elif kind == _ARRAY:
            item, n = self.u32(), self.u64()
            if item == _STRING:
                for _ in range(n):
                    size = self.u64()
                    self.off += size
            elif item in _SCALAR:
                self.off += n * struct.calcsize(_SCALAR[item])
            else:
                for _ in range(n):
                    self.skip(item)
        else:
            self.off += struct.calcsize(_SCALAR[kind])


# array.array type codes of the same sizes as struct's standard ones
_ARRAY_CODE = {"B": "B", "b": "b", "H": "H", "h": "h", "f": "f", "d": "d",
               "I": "I" if array.array("I").itemsize == 4 else "L",
               "i": "i" if array.array("i").itemsize == 4 else "l",
               "Q": "Q", "q": "q"}


@dataclass(frozen=True)
class GGUFMetadata:
    """What this engine needs from a GGUF file: the vocabulary, its special
    tokens, the chat template and the training context."""

    architecture: str
    context_train: int | None
    tokenizer_model: str
    tokens: list[str]
    token_types: Sequence[int]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    add_bos: bool | None
    chat_template: str | None
    chat_templates: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str) -> "GGUFMetadata":
        kv = read_gguf_metadata(path)
        arch = str(kv.get("general.architecture", ""))
        tokens = list(kv.get("tokenizer.ggml.tokens") or [])
        types = kv.get("tokenizer.ggml.token_type")
        if types is None or len(types) != len(tokens):
            types = array.array("i", [NORMAL]) * len(tokens)

        def token_id(name: str) -> int | None:
            v = kv.get(f"tokenizer.ggml.{name}")
            return int(v) if isinstance(v, int) and 0 <= v < len(tokens) else None

        ctx = kv.get(f"{arch}.context_length")
        named = {k[len("tokenizer.chat_template."):]: v for k, v in kv.items()
                 if k.startswith("tokenizer.chat_template.") and isinstance(v, str)}
        add_bos = kv.get("tokenizer.ggml.add_bos_token")
        return cls(architecture=arch, context_train=int(ctx) if isinstance(ctx, int) else None,
                   tokenizer_model=str(kv.get("tokenizer.ggml.model", "")), tokens=tokens,
                   token_types=types, bos_id=token_id("bos_token_id"), eos_id=token_id("eos_token_id"),
                   eot_id=token_id("eot_token_id"), eom_id=token_id("eom_token_id"),
                   add_bos=bool(add_bos) if add_bos is not None else None,
                   chat_template=kv.get("tokenizer.chat_template"), chat_templates=named)


