"""lucegen.LLM's GPU engines on lucegen/runtime/host_device.py's HostDevice: every launch of the megakernel engine,
the quantised target's plain decoding (one-slot verify passes, no draft) and the speculative engine is checked
against the compiled kernels, greedy and sampled (logits to the host sampler), with stop tokens seen at chunk ends;
closing the LLM frees every allocation. The tokens are the host device's stand-ins (what the GPU tests check is
tests/gpu/test_api_gpu.py)."""

from __future__ import annotations

import pytest

import lucegen
from lucegen.model.config import ModelConfig
from lucegen.runtime import device as device_module
from lucegen.runtime.gpu_engines import chunk_sizes

from host_replies import STAND_IN_TOKEN, open_host_devices  # tests/host_replies.py

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from lucegen.model.dflash import DFlashConfig
    from lucegen.model.init_dflash import write_dflash_checkpoint
    from lucegen.model.init_gguf import write_gguf_checkpoint
    from lucegen.model.init_weights import write_hf_checkpoint

    root = tmp_path_factory.mktemp("api-host")
    write_gguf_checkpoint(ModelConfig.preset("tiny-q"), root / "tiny-q.gguf", quant="q4_k_m", seed=0, progress=False)
    write_dflash_checkpoint(DFlashConfig.preset("dflash-tiny-q"), root / "draft-q", seed=0, progress=False)
    write_hf_checkpoint(ModelConfig.preset("tiny"), root / "tiny", seed=0, progress=False)
    return root


@pytest.fixture
def host(monkeypatch):
    return open_host_devices(monkeypatch)


def test_chunks_grow_to_the_chunk_size():
    assert list(chunk_sizes(40, 16)) == [1, 2, 4, 8, 16, 9]
    assert list(chunk_sizes(3, 16)) == [1, 2] and list(chunk_sizes(0, 16)) == []


@pytest.mark.parametrize("model, engine", [("tiny", "the decode megakernel"), ("tiny-q.gguf", "the quantised target")])
def test_plain_decoding_engines(models, host, model, engine):
    with lucegen.LLM(models / model, device="gpu", max_context=96) as llm:
        assert llm.engine.name.startswith(engine)
        greedy = llm.generate("def f(x):", max_tokens=20, stop_token_ids=[])
        assert greedy.token_ids == [STAND_IN_TOKEN] * 20 and greedy.finish_reason == "length"
        stopped = llm.generate("def f(x):", max_tokens=20, stop_token_ids=[STAND_IN_TOKEN])
        assert stopped.token_ids == [] and stopped.finish_reason == "stop" and stopped.stop_reason == STAND_IN_TOKEN
        # top-k: drawn on the host from each step's logits (the stand-in's zeros: uniform over the top 50)
        sampled = llm.generate("def f(x):", max_tokens=6, temperature=1.0, top_k=50, seed=4, stop_token_ids=[])
        again = llm.generate("def f(x):", max_tokens=6, temperature=1.0, top_k=50, seed=4, stop_token_ids=[])
        assert len(sampled.token_ids) == 6 and sampled.token_ids == again.token_ids
        assert len(set(sampled.token_ids)) > 1  # drawn from the (uniform) logits, not the stand-in argmax
        # temperature alone: drawn on the device (the stand-in's argmax), in the same chunks as greedy steps
        before = len(host[-1].launches)
        fused = llm.generate("def f(x):", max_tokens=6, temperature=0.8, seed=4, stop_token_ids=[])
        assert fused.token_ids[1:] == [STAND_IN_TOKEN] * 5  # the first: the prefill's, drawn from its logits
        sampled_kernels = {name for name, *_ in host[-1].launches[before:]}
        with pytest.raises(lucegen.api.LucegenError, match="penalties run on the CPU engine only"):
            llm.stream("def f(x):", repetition_penalty=1.2)
    dev = host[-1]
    assert dev.allocated == 0, f"{dev.allocated} bytes left allocated"
    names = {name for name, *_ in dev.launches}
    if engine == "the quantised target":
        assert any(n.startswith("quant_gemm") for n in names) and any("greedy_advance" in n for n in names)
        assert "rows_sample" in sampled_kernels


def test_megakernel_prefill_through_the_megakernel(models, host):
    with lucegen.LLM(models / "tiny", device="gpu", max_context=64, prefill="megakernel") as llm:
        c = llm.generate("hello there", max_tokens=5, stop_token_ids=[])
        assert c.token_ids == [STAND_IN_TOKEN] * 5
    assert host[-1].allocated == 0


def test_speculative_engine(models, host):
    with lucegen.LLM(models / "tiny-q.gguf", models / "draft-q", device="gpu", max_context=128, budget=4) as llm:
        assert llm.engine.reserve == 5 and "memory plan" in llm.engine.memory_plan()
        c = llm.generate("def f(x):", max_tokens=12, stop_token_ids=[])
        assert len(c.token_ids) == 12 and c.timings.acceptance_length is not None
        s = llm.generate("def f(x):", max_tokens=12, temperature=0.7, seed=2, stop_token_ids=[])
        assert len(s.token_ids) == 12 and s.token_ids == llm.generate(
            "def f(x):", max_tokens=12, temperature=0.7, seed=2, stop_token_ids=[]).token_ids
    assert host[-1].allocated == 0


def test_one_live_sequence_per_gpu_engine(models, host):
    from lucegen.model.sampling import GREEDY

    with lucegen.LLM(models / "tiny", device="gpu", max_context=64) as llm:
        first = llm.engine.sequence()
        token = first.prefill([1, 2, 3], GREEDY)
        llm.engine.sequence()
        with pytest.raises(lucegen.api.LucegenError, match="one sequence at a time"):
            next(first.decode(token, 2, GREEDY, [1, 2, 3, token]))


def test_a_shared_device_and_a_mismatched_target(models, host):
    dev = device_module.Device.open("sm_90")
    with lucegen.LLM(models / "tiny", device=dev, max_context=32) as a, \
            lucegen.LLM(models / "tiny-q.gguf", device=dev, max_context=32) as b:
        assert a.generate("x", max_tokens=2).token_ids and b.generate("x", max_tokens=2).token_ids
    assert dev.allocated == 0
    with pytest.raises(lucegen.api.LucegenError, match="opened with sm_90"):
        lucegen.LLM(models / "tiny", device=dev, target="sm_86")


def test_bench_json_survives_a_missing_baseline(models, host, tmp_path, capsys):
    """`bench decode` / `bench prefill` with the HF and cuBLAS baselines unable to run (torch has no CUDA here):
    the rows say why and the JSON is written, to a file or to stdout with `--json -`."""
    import json

    from lucegen.cli import main

    tiny = str(models / "tiny")
    assert main(["bench", "decode", "--model", tiny, "--prompt-tokens", "4", "--gen-tokens", "8", "--repeats", "1",
                 "--json", "-"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["tok_s"] > 0 and result["hf_error"] and "speedup_vs_hf" not in result
    assert "not measured (" in err and "decode tok/s" in err
    path = tmp_path / "prefill.json"
    assert main(["bench", "prefill", "--model", tiny, "--tokens", "40", "--repeats", "1", "--json", str(path)]) == 0
    out, err = capsys.readouterr()
    result = json.loads(path.read_text())
    assert result["rows"][0]["tokens"] == 40 and result["hf_error"] and result["gemm_error"]
    assert "HF: not measured (" in out and "GEMM vs cuBLAS: not measured" in out


def test_a_failing_engine_frees_what_it_built(models, host):
    with pytest.raises(lucegen.api.LucegenError, match="budget"):
        lucegen.LLM(models / "tiny-q.gguf", models / "draft-q", device="gpu", max_context=64, budget=-1)
    assert host[-1].allocated == 0


def test_bench_prefill_of_a_quantised_gguf(models, host, capsys):
    """`bench prefill --model FILE.gguf` runs the quantised target's prefill (K-quant GEMMs), not the megakernel."""
    import json

    from lucegen.cli import main

    assert main(["bench", "prefill", "--model", str(models / "tiny-q.gguf"), "--tokens", "24", "--repeats", "1",
                 "--no-hf", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["engine"] == "quantised target" and result["rows"][0]["tokens"] == 24
    assert "K-quant blocks" in result["gemm_error"] and "(quantised target)" in err
    assert any(name.startswith("quant_gemm") for name, *_ in host[-1].launches)


@pytest.mark.parametrize("model", ["tiny", "tiny-q.gguf"])
def test_a_sequence_runs_in_another_thread_than_the_one_that_built_the_engine(models, host, model):
    """A CUDA context is current per thread: lucegen serve steps the engine in its own thread, so the engine
    makes the device's context current there (the host device fails a launch from a thread it is not current in,
    as the driver does)."""
    import threading

    from lucegen.errors import DeviceError

    with lucegen.LLM(models / model, device="gpu", max_context=96) as llm:
        here = llm.generate("def f(x):", max_tokens=8, stop_token_ids=[]).token_ids
        results = {}

        def other_thread():
            try:
                results["tokens"] = llm.generate("def f(x):", max_tokens=8, stop_token_ids=[]).token_ids
            except Exception as exc:  # noqa: BLE001 - the test reports whatever the thread met
                results["error"] = exc

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        assert results == {"tokens": here}

        def bare_launch():
            try:
                host[0].alloc(256)
            except DeviceError as exc:
                results["bare"] = str(exc)

        worker = threading.Thread(target=bare_launch)
        worker.start()
        worker.join()
        assert "CUDA_ERROR_INVALID_CONTEXT" in results["bare"]
