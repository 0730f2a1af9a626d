"""Sampling defaults: the client's value, then the worker's configuration, then the
model's own recommendation, then neutral values."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from pool.local.chat import LocalChat
from pool.local.sampling import SamplingDefaults, model_sampling_defaults, resolve_defaults
from pool.model import Sampling
from tests.unit.test_local_chat import ScriptedEngine, request


def params(defaults: SamplingDefaults, sampling: Sampling = Sampling(), prompt_len: int = 5):
    return LocalChat(ScriptedEngine([]), "m", defaults=defaults).params(request(sampling=sampling),
                                                               prompt_len)


def test_the_client_wins_then_the_defaults_then_neutral_values() -> None:
    d = SamplingDefaults(temperature=0.2, top_p=0.9, top_k=40, max_tokens=64)
    p = params(d)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.2, 0.9, 40, 64)
    p = params(d, Sampling(temperature=0.0, top_p=0.5, top_k=3, max_tokens=7))
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.0, 0.5, 3, 7)
    p = params(SamplingDefaults())
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (1.0, 1.0, 0, 507)


def test_a_default_max_tokens_never_runs_past_the_context() -> None:
    assert params(SamplingDefaults(max_tokens=4096), prompt_len=500).max_tokens == 12


def test_generation_config_json_of_an_hf_folder(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True}))
    assert model_sampling_defaults(str(tmp_path)) == SamplingDefaults(0.6, 0.95, 20, None)
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": False, "temperature": 0.6, "max_new_tokens": 99}))
    assert model_sampling_defaults(str(tmp_path)) == SamplingDefaults(temperature=0.0,
                                                                      max_tokens=99)
    (tmp_path / "generation_config.json").write_text("not json")
    assert model_sampling_defaults(str(tmp_path)) == SamplingDefaults()


def test_gguf_general_sampling_keys(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_float32("general.sampling.temp", 0.25)
    writer.add_float32("general.sampling.top_p", 0.8)
    writer.add_int32("general.sampling.top_k", 30)
    writer.add_tensor("t", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    got = model_sampling_defaults(str(path))
    assert (round(got.temperature, 4), round(got.top_p, 4), got.top_k) == (0.25, 0.8, 30)


def test_the_workers_configuration_wins_over_the_model(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95}))
    got = resolve_defaults({"temperature": 0.1, "max_tokens": 32}, str(tmp_path))
    assert got == SamplingDefaults(temperature=0.1, top_p=0.95, max_tokens=32)
    assert resolve_defaults(None, str(tmp_path / "missing")) == SamplingDefaults()


def test_settings_check_sampling_defaults() -> None:
    import pytest
    from pydantic import ValidationError

    from app.settings import WorkerSettings

    w = WorkerSettings(name="w", kind="local", engine="llamacpp", model="m.gguf",
                       sampling_defaults={"temperature": 0.3, "max_tokens": 100})
    assert w.sampling_defaults.model_dump(exclude_none=True) == {"temperature": 0.3,
                                                                 "max_tokens": 100}
    for bad in ({"temperature": -1}, {"top_p": 0}, {"max_tokens": 0}, {"min_p": 0.1}):
        with pytest.raises(ValidationError):
            WorkerSettings(name="w", kind="local", engine="llamacpp", model="m.gguf",
                           sampling_defaults=bad)
