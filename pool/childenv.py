"""The environment a worker child gets: an allow-list of the gateway's own.

The gateway's environment holds its secrets (``POOLGATE_API_KEYS``, the admin
and metrics tokens, every upstream key); a worker child, and the vLLM/SGLang
server it starts, get none of it unless the worker's configuration names it.
What passes by default is what the programs we start need to run: the search
path, home and locale, temporary files, model caches, thread counts and the
GPU selection. Variables matched only by a prefix are still held back when
their name looks like a credential (``HF_TOKEN``, ``VLLM_API_KEY``); a name
listed in ``env_passthrough`` passes whatever it is called.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["DEFAULT_NAMES", "DEFAULT_PREFIXES", "PROXY_NAMES", "child_environment",
           "proxy_environment"]

#: passed by exact name
DEFAULT_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "LD_LIBRARY_PATH", "XDG_CACHE_HOME",
    # Hugging Face caches and offline switches (not HF_TOKEN: name it to pass it)
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE",
    "HF_HUB_DISABLE_TELEMETRY",
})
#: passed by prefix: locale, thread pools, CUDA/ROCm device selection, engine tuning
DEFAULT_PREFIXES = ("LC_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "CUDA_", "NVIDIA_", "HIP_",
                    "ROCR_", "NCCL_", "TORCH", "PYTORCH_", "TRITON_", "VLLM_", "SGLANG_",
                    "GGML_", "LLAMA_")
_SECRET_LOOKING = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL|AUTH", re.IGNORECASE)


def _allowed(name: str) -> bool:
    if name in DEFAULT_NAMES:
        return True
    return name.startswith(DEFAULT_PREFIXES) and not _SECRET_LOOKING.search(name)


def child_environment(environment: Mapping[str, str],
                      passthrough: Iterable[str] = ()) -> dict[str, str]:
    """The part of ``environment`` a worker child may see: the defaults above
    plus the names in ``passthrough``."""
    named = frozenset(passthrough)
    return {k: v for k, v in environment.items() if k in named or _allowed(k)}


#: what a vendor CLI reads its egress proxy from (docs/cli-workers.md says which reads which)
PROXY_NAMES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")


def proxy_environment(proxy: str | None) -> dict[str, str]:
    """The variables that send a CLI child's every request through ``proxy``:
    each name in both cases (tools differ in which they read first), and
    ``NO_PROXY`` empty so no host goes around it (loopback included). None:
    nothing (the child then gets no proxy variable from the gateway)."""
    if proxy is None:
        return {}
    env = {}
    for name in PROXY_NAMES:
        env[name] = env[name.lower()] = proxy
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env
