"""A checkpoint or context too big for the device (lucegen/runtime/memory_fit.py): the forecast against the host-only
device's ledger of what the engines allocate, and the one-line refusal, before any allocation, from ``lucegen.LLM``
and ``lucegen run``, saying what would fit."""

from __future__ import annotations

import dataclasses

import pytest

import lucegen
from lucegen.errors import LucegenError
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.config import ModelConfig
from lucegen.runtime import device as device_module
from lucegen.runtime.host_device import HostDevice
from lucegen.runtime.memory_fit import Forecast, forecast
from lucegen.target import load_target

MIB = 2**20


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny preset's BF16 checkpoint (the megakernel) and the tiny-q preset as a Q4_K_M GGUF (the quantised
    target)."""
    from lucegen.model.init_gguf import write_gguf_checkpoint
    from lucegen.model.init_weights import write_hf_checkpoint

    root = tmp_path_factory.mktemp("fit")
    write_hf_checkpoint(ModelConfig.preset("tiny"), root / "tiny", seed=0, progress=False)
    write_gguf_checkpoint(ModelConfig.preset("tiny-q"), root / "tiny-q.gguf", quant="q4_k_m", seed=0, progress=False)
    return root


def small_device(memory_bytes: int, name: str = "sm_90") -> HostDevice:
    return HostDevice(dataclasses.replace(load_target(name), memory_bytes=memory_bytes))


ENGINES = [("tiny", "the decode megakernel"), ("tiny-q.gguf", "the quantised target")]


# ------------------------------------------------------------------------------------------------ the forecast
@pytest.mark.parametrize("model, engine", ENGINES)
@pytest.mark.parametrize("context", [16, 2048, 9000])
def test_forecast_is_a_close_lower_bound_of_the_ledger(models, model, engine, context):
    """What the engine allocates (the host device's ledger) is at least the forecast, and not much more."""
    dev = HostDevice(load_target("sm_90"))
    need = forecast(load_checkpoint(models / model), dev.target)
    assert need.engine == engine
    with lucegen.LLM(models / model, device=dev, max_context=context):
        allocated = dev.allocated
    assert 0.8 * allocated <= need.bytes_at(context) <= allocated
    assert dev.allocated == 0


def test_largest_context_is_the_last_that_fits():
    need = Forecast("the decode megakernel", weights=1000, state=100, per_token=10, kv="bf16", max_position=500,
                    segment=64, workspace=lambda rows: 3 * rows + 7)
    for available in (1000, 1110, 1117, 1130, 2000, 4000, 10_000):
        fits = need.largest_context(available)
        assert fits == max([c for c in range(1, 501) if need.bytes_at(c) <= available], default=0)
    assert need.largest_context(10**9) == 500  # the model's limit
    with pytest.raises(LucegenError, match="the largest max_context that fits is 72$"):
        need.check(100, need.bytes_at(72), "m", "dev")
    need.check(72, need.bytes_at(72), "m", "dev")  # fits exactly: no error
    with pytest.raises(LucegenError, match=r"nothing: the weights alone need 1\.0 KiB$"):
        need.check(4, 999, "m", "dev")
    with pytest.raises(LucegenError, match="nothing: the weights, state and prefill workspace need"):
        need.check(4, 1100, "m", "dev")


def test_the_27b_in_bf16_on_each_chip():
    """The megakernel's forecast of the real 27B shapes (a checkpoint stand-in: only its config is read): 2 bytes a
    parameter of weights, which no 24 GB chip holds, and the whole 262144-position context beside them on 80 GB."""
    import types

    config = ModelConfig.preset("qwen3.5-27b")
    need = forecast(types.SimpleNamespace(config=config), load_target("sm_90"))
    assert need.engine == "the decode megakernel" and need.kv == "bf16"
    assert 2 * config.num_parameters() <= need.weights < 2.01 * config.num_parameters()
    assert need.per_token == 16 * 2 * 4 * 512 + 4 * 3  # KV rows of 16 attention layers, three int32 entries
    assert need.largest_context(load_target("sm_90").memory_bytes) == config.max_position_embeddings
    with pytest.raises(LucegenError, match=r"nothing: the weights alone need 50\.10 GiB$"):
        need.check(4096, load_target("sm_89").memory_bytes, "qwen3.5-27b", "RTX 4090")


# ------------------------------------------------------------------------------------------------ lucegen.LLM
@pytest.mark.parametrize("model, engine", ENGINES)
def test_a_checkpoint_too_big_is_refused_before_any_allocation(models, model, engine):
    dev = small_device(MIB)
    with pytest.raises(LucegenError) as info:
        lucegen.LLM(models / model, device=dev, max_context=64)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{model} needs at least ")
    assert f"for {engine} at max_context 64" in message and "host dry run (sm_90) has 1.0 MiB free" in message
    assert "what would fit: nothing: the weights alone need " in message
    assert dev.allocated == 0 and not dev.live and not dev.launches


@pytest.mark.parametrize("model, engine", ENGINES)
def test_a_context_too_long_says_the_longest_that_fits(models, model, engine):
    dev = small_device(20 * MIB)
    with pytest.raises(LucegenError, match=r"the largest max_context that fits is (\d+)$") as info:
        lucegen.LLM(models / model, device=dev, max_context=200_000)
    assert dev.allocated == 0 and not dev.live
    fits = int(str(info.value).rsplit(" ", 1)[1])
    assert 100 < fits < 200_000
    with lucegen.LLM(models / model, device=dev, max_context=fits) as llm:  # what it names does pass
        assert llm.max_context == fits
    assert dev.allocated == 0
    with pytest.raises(LucegenError, match=f"is {fits}$"):
        lucegen.LLM(models / model, device=dev, max_context=fits + 1)


def test_another_engine_on_the_device_leaves_less_room(models):
    """The room is what the device has free: a second LLM on a shared device sees the first one's allocations."""
    dev = HostDevice(load_target("sm_90"))
    need = forecast(load_checkpoint(models / "tiny"), dev.target).bytes_at(64)
    with lucegen.LLM(models / "tiny", device=dev, max_context=64):
        first = dev.allocated
    dev = small_device(first + need - 1)  # room for one engine, not for two
    with lucegen.LLM(models / "tiny", device=dev, max_context=64):
        with pytest.raises(LucegenError, match="what would fit"):
            lucegen.LLM(models / "tiny", device=dev, max_context=64)
        assert dev.allocated == first
    with lucegen.LLM(models / "tiny", device=dev, max_context=64):  # alone again: it fits
        pass


# ------------------------------------------------------------------------------------------------ lucegen run
@pytest.mark.parametrize("max_context, what", [(None, "nothing: the weights alone need"),
                                               ("200000", "the largest max_context that fits is")])
def test_cli_run_refuses_in_one_line(models, monkeypatch, capsys, max_context, what):
    from lucegen.cli import main

    devices = []

    def open_small(cls, target=None):
        devices.append(small_device(MIB if max_context is None else 20 * MIB, target or "sm_90"))
        return devices[-1]

    monkeypatch.setattr(device_module.Device, "open", classmethod(open_small))
    argv = ["run", "--model", str(models / "tiny-q.gguf"), "--device", "gpu", "--prompt", "hi", "--max-tokens", "4"]
    code = main(argv + (["--max-context", max_context] if max_context else []))
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and err.startswith("lucegen: error: tiny-q.gguf needs at least ")
    assert what in err and "Traceback" not in err and out == ""
    assert devices and all(d.allocated == 0 and not d.live for d in devices)
