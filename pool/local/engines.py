"""Engine construction by name (inside the child: engines import heavy libraries)."""

from __future__ import annotations

from typing import Any

from .engine import Engine

__all__ = ["make_engine"]


def make_engine(config: dict[str, Any]) -> Engine:
    name = config["engine"]
    common = {"context_length": config.get("context_length"), "capacity": config.get("capacity") or 1}
    args = dict(config.get("engine_args") or {})
    gpu_ids = tuple(config["gpu_ids"]) if config.get("gpu_ids") else None
    if name == "transformers":
        from .transformers_engine import TransformersEngine

        device = args.pop("device", "cuda" if gpu_ids else "cpu")
        dtype = args.pop("dtype", "float32" if device == "cpu" else "bfloat16")
        return TransformersEngine(config["model"], threads=config.get("threads"), device=device,
                                  dtype=dtype, chat_template=config.get("chat_template"),
                                  engine_args=args, **common)
    if name == "llamacpp":
        from .llamacpp import LlamaCppEngine

        gpu_layers = args.pop("gpu_layers", None)
        return LlamaCppEngine(config["model"], threads=config.get("threads"), gpu_layers=gpu_layers,
                              chat_template=config.get("chat_template"), engine_args=args, **common)
    if name == "vllm":
        from .vllm import VLLMEngine

        return VLLMEngine(config["model"], gpu_ids=gpu_ids, **_server_args(args), **common)
    if name == "sglang":
        from .sglang import SGLangEngine

        return SGLangEngine(config["model"], gpu_ids=gpu_ids, **_server_args(args), **common)
    raise ValueError(f"unknown engine {name!r}")


def _server_args(args: dict[str, Any]) -> dict[str, Any]:
    """engine_args of an engine server: ``python``, ``port``, ``env``, ``ready_timeout``
    and ``extra_args`` (the server's own command-line flags)."""
    known = {"python", "port", "env", "ready_timeout", "extra_args", "launcher"}
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown engine_args {sorted(unknown)} (known: {sorted(known)})")
    out = dict(args)
    if "extra_args" in out:
        out["extra_args"] = tuple(out["extra_args"])
    if "launcher" in out:
        out["launcher"] = tuple(out["launcher"])
    return out
