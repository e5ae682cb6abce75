"""NVFP4 (docs/nvfp4.md): the numpy statement of the format, the ModelOpt-layout reader, ``lucegen quantize`` and
the CPU engine on its output."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lucegen.cli import main
from lucegen.errors import CheckpointError, LucegenError
from lucegen.model import nvfp4
from lucegen.model.checkpoint import load_checkpoint

E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


# ------------------------------------------------------------------------------------------- code tables
def test_every_e4m3_code_round_trips():
    codes = np.arange(256, dtype=np.uint8)
    values = nvfp4.e4m3_decode(codes)
    nan = np.isnan(values)
    assert codes[nan].tolist() == [0x7F, 0xFF]
    assert np.array_equal(nvfp4.e4m3_encode(values[~nan]), codes[~nan])
    assert nvfp4.e4m3_decode(np.array([0x7E, 0x38, 0x01, 0x08, 0xB8], np.uint8)).tolist() == \
        [448.0, 1.0, 2.0**-9, 2.0**-6, -1.0]


def test_e4m3_decode_and_rounding_match_torch():
    torch = pytest.importorskip("torch")
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(nvfp4.e4m3_decode(codes),
                          torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy(), equal_nan=True)
    x = np.random.default_rng(0).standard_normal(200_000).astype(np.float32) * np.float32(40)
    x = np.concatenate([np.clip(x, -448, 448), (nvfp4.e4m3_decode(codes[:0x7E]).astype(np.float64)
                                                 + nvfp4.e4m3_decode(codes[1:0x7F])).astype(np.float32) / 2])
    assert np.array_equal(nvfp4.e4m3_encode(x), torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy())


def test_every_e2m1_code_decodes_to_the_table():
    codes = np.arange(16, dtype=np.uint8)
    assert nvfp4.E2M1_VALUES[codes].tolist() == E2M1_TABLE + [-v for v in E2M1_TABLE]
    assert np.array_equal(nvfp4.e2m1_encode(nvfp4.E2M1_VALUES[codes[codes != 8]]), codes[codes != 8])


def test_e2m1_rounds_to_nearest_ties_to_even_and_saturates():
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 1e9, -0.75, -0.2, 0.26])
    assert nvfp4.E2M1_VALUES[nvfp4.e2m1_encode(x)].tolist() == [0, 1, 1, 2, 2, 4, 4, 6, 6, -1, -0.0, 0.5]


def test_packing_puts_the_first_element_in_the_low_nibble():
    codes = np.array([[1, 2, 15, 8]], np.uint8)
    assert nvfp4.pack_e2m1(codes).tolist() == [[0x21, 0x8F]]
    assert np.array_equal(nvfp4.unpack_e2m1(nvfp4.pack_e2m1(codes)), codes)


# ------------------------------------------------------------------------------------------- round trips
def _matrices():
    rng = np.random.default_rng(7)
    normal = rng.standard_normal((64, 256)).astype(np.float32) * np.float32(0.02)
    heavy = rng.standard_t(2, (32, 128)).astype(np.float32)
    zero_blocks = normal[:16, :64].copy()
    zero_blocks[:, 16:32] = 0
    spread = (rng.standard_normal((16, 64)) * np.exp2(rng.integers(-30, 10, (16, 64)))).astype(np.float32)
    return {"normal": normal, "heavy-tailed": heavy, "zero blocks": zero_blocks, "wide exponent range": spread,
            "all zero": np.zeros((4, 32), np.float32)}


@pytest.mark.parametrize("kind", list(_matrices()))
def test_quantise_dequantise_error_is_within_half_an_e2m1_step(kind):
    """Each value is off by at most half the E2M1 spacing at its scaled magnitude (0.25 below 2, 0.5 below 4, 1
    above; the saturation of a block whose E4M3 scale rounded down stays inside that) times its block's scale."""
    w = _matrices()[kind]
    packed, scales, scale_2 = nvfp4.quantize(w)
    assert packed.shape == (w.shape[0], w.shape[1] // 2) and scales.shape == (w.shape[0], w.shape[1] // 16)
    assert scale_2 == (np.float32(np.abs(w).max() / np.float32(6 * 448)) if w.any() else 1.0)
    out = nvfp4.dequantize(packed, scales, scale_2)
    block_scale = np.repeat(nvfp4.e4m3_decode(scales) * scale_2, 16, axis=1)
    scaled = np.abs(w) / block_scale
    half_step = np.where(scaled < 2, 0.25, np.where(scaled < 4, 0.5, 1.0))
    assert np.all(np.abs(out - w) <= half_step * block_scale * (1 + 1e-6))
    assert np.array_equal(out[w == 0], np.zeros(np.count_nonzero(w == 0), np.float32))
    # per block: the largest value lands within an E2M1 relative step (1/3 at 3, 1/6 at 6) of itself
    if kind in ("normal", "heavy-tailed"):
        blocks, deq = w.reshape(-1, 16), out.reshape(-1, 16)
        i = np.argmax(np.abs(blocks), axis=1)
        rows = np.arange(len(blocks))
        assert np.all(np.abs(deq[rows, i] - blocks[rows, i]) <= np.abs(blocks[rows, i]) / 6 * 1.07)


def test_quantise_rejects_a_row_length_not_a_multiple_of_16():
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.quantize(np.ones((4, 24), np.float32))


# ------------------------------------------------------------------------------- a ModelOpt-layout replica
def _write_replica(src, out, corrupt=None, sharded=False):
    """A ModelOpt-layout NVFP4 directory written with the safetensors library (not lucegen's writer): random E2M1
    bytes and E4M3 scales for every MLP matrix, scalar ``weight_scale_2`` and ``input_scale`` as ModelOpt stores
    them; the other tensors copied. Returns {hf name: (packed, scales, scale_2)}."""
    from safetensors.numpy import save_file

    ck = load_checkpoint(src)
    rng = np.random.default_rng(3)
    tensors, parts = {}, {}
    for name in ck.names():
        stored = ck.where[name][1]
        if ".mlp." in name:
            rows, cols = ck.shape(name)
            module = stored[: -len(".weight")]
            packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
            scales = rng.integers(0x01, 0x7F, (rows, cols // 16), dtype=np.uint8)  # positive, finite, nonzero
            scale_2 = np.array(rng.uniform(1e-4, 1e-2), np.float32)
            parts[name] = (packed, scales, scale_2)
            tensors[stored] = packed
            tensors[module + ".weight_scale"] = scales
            tensors[module + ".weight_scale_2"] = scale_2
            tensors[module + ".input_scale"] = np.array(0.05, np.float32)
        else:
            tensors[stored] = np.array(ck.raw(name)).view(np.uint16)
    dtypes = {k: "F8_E4M3" if k.endswith(".weight_scale") else None for k in tensors}
    if corrupt:
        corrupt(tensors)
    out.mkdir()
    bf16 = {ck.where[n][1] for n in ck.names() if ".mlp." not in n}
    shards = {"model.safetensors": tensors}
    if sharded:  # the MLP layers in a shard of their own, found through the index
        shards = {"model-00001-of-00002.safetensors": {k: v for k, v in tensors.items() if ".mlp." not in k},
                  "model-00002-of-00002.safetensors": {k: v for k, v in tensors.items() if ".mlp." in k}}
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: f for f, part in shards.items() for k in part}}))
    for fname, part in shards.items():
        save_file(part, str(out / fname))
        _relabel(out / fname, dtypes, bf16)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                     "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float",
                                                                               "group_size": 16}}}}
    (out / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out / f).write_bytes((src / f).read_bytes())
    return parts


def _relabel(path, dtypes, bf16):
    """The numpy writer has no F8_E4M3 or BF16: those tensors are stored as U8 / U16 and relabelled in the header
    (the bytes are the same; the data offsets are relative to the data region)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    for name, info in header.items():
        if name in bf16:
            info["dtype"] = "BF16"
        elif dtypes.get(name):
            info["dtype"] = dtypes[name]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])


def _independent_dequantise(packed, scales, scale_2):
    """The format read off ModelOpt's description, written out here without lucegen.model.nvfp4."""
    torch = pytest.importorskip("torch")
    table = np.array(E2M1_TABLE + [-v for v in E2M1_TABLE], np.float32)
    low, high = table[packed & 0xF], table[packed >> 4]
    values = np.stack([low, high], axis=-1).reshape(packed.shape[0], -1)
    scale = torch.from_numpy(scales).view(torch.float8_e4m3fn).float().numpy() * np.float32(scale_2)
    return values * np.repeat(scale, 16, axis=1)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_modelopt_replica_reads_as_its_dequantised_weights(tiny, tmp_path, sharded):
    parts = _write_replica(tiny / "st", tmp_path / "q", sharded=sharded)
    ck = load_checkpoint(tmp_path / "q")
    bf = load_checkpoint(tiny / "st")
    assert parts
    for name in ck.names():
        if name in parts:
            assert ck.dtype(name) == "NVFP4" and ck.shape(name) == bf.shape(name)
            assert np.array_equal(ck.f32(name), _independent_dequantise(*parts[name]))
        else:
            assert np.array_equal(ck.f32(name), bf.f32(name))


@pytest.mark.parametrize("damage, message", [
    (lambda t: t["model.layers.0.mlp.up_proj.weight_scale"].__setitem__((0, 0), 0), "zero, negative, NaN"),
    (lambda t: t["model.layers.1.mlp.down_proj.weight_scale"].__setitem__((2, 1), 0x7F), "zero, negative, NaN"),
    (lambda t: t.__setitem__("model.layers.0.mlp.gate_proj.weight_scale_2", np.array(np.nan, np.float32)),
     "zero, negative, NaN"),
    (lambda t: t.pop("model.layers.2.mlp.gate_proj.weight_scale_2"), "has no 'model.layers.2.mlp.gate_proj"),
    (lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight",
                             t["model.layers.0.mlp.up_proj.weight"][:, :-1].copy()), "packed NVFP4 shape"),
])
def test_a_damaged_replica_is_one_error_naming_the_tensor(tiny, tmp_path, damage, message):
    _write_replica(tiny / "st", tmp_path / "q", corrupt=damage)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(tmp_path / "q")
    assert "\n" not in str(info.value) and "model.layers." in str(info.value)


# -------------------------------------------------------------------------------------------- quantize
@pytest.fixture(scope="module")
def quantised(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("nvfp4") / "q"
    assert main(["quantize", "--model", str(tiny / "st"), "--format", "nvfp4", "--out", str(out), "--quiet"]) == 0
    return out


def test_quantize_writes_modelopt_layout(tiny, quantised):
    from safetensors import safe_open

    hf_quant = json.loads((quantised / "hf_quant_config.json").read_text())["quantization"]
    assert (hf_quant["quant_algo"], hf_quant["group_size"]) == ("W4A16_NVFP4", 16)
    assert "lm_head" in hf_quant["exclude_modules"]
    qc = json.loads((quantised / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["quant_algo"]) == ("modelopt", "W4A16_NVFP4")
    bf = load_checkpoint(tiny / "st")
    with safe_open(str(quantised / "model.safetensors"), "pt") as f:  # the safetensors library reads it
        keys = set(f.keys())
        w = f.get_tensor("model.layers.0.mlp.down_proj.weight")
        s = f.get_tensor("model.layers.0.mlp.down_proj.weight_scale")
        assert str(w.dtype) == "torch.uint8" and tuple(w.shape) == (128, 128)
        assert str(s.dtype) == "torch.float8_e4m3fn" and tuple(s.shape) == (128, 16)
        assert tuple(f.get_tensor("model.layers.0.mlp.down_proj.weight_scale_2").shape) == ()  # a scalar
    assert "model.layers.0.linear_attn.in_proj_a.weight_scale" not in keys
    assert "model.embed_tokens.weight_scale" not in keys
    assert not any(k.endswith(".input_scale") for k in keys)  # weight-only: no activation scales
    ck = load_checkpoint(quantised)
    name = "layers.3.self_attn.q_proj.weight"
    assert ck.dtype(name) == "NVFP4"
    assert np.array_equal(ck.f32(name), nvfp4.dequantize(*nvfp4.quantize(bf.f32(name))))
    assert ck.dtype("layers.0.linear_attn.in_proj_a.weight") == "BF16"


def test_nvfp4_logits_stay_close_to_bf16(tiny, quantised, tmp_path, capsys):
    """Teacher-forced logits over 64 positions against the BF16 source, next to llama.cpp's Q4_0 (also 4 bits a
    value, blocks of 32) of the same weights. The tiny model's random weights have no structure for quantisation to
    spare: each NVFP4 matrix is ~9.5% off in relative RMS (the E2M1 grid on Gaussian blocks of 16), which four
    layers carry to a mean cosine near 0.94. The bars: that per-matrix error, a mean cosine above 0.92, top-1
    agreement of 90%, and at least Q4_0's cosine on the same weights."""
    from lucegen.model.reference import Reference

    q4_0 = tmp_path / "q4_0.gguf"
    assert main(["init-weights", "--preset", "tiny", "--format", "gguf", "--quant", "q4_0", "--out", str(q4_0),
                 "--quiet"]) == 0
    bf, q = load_checkpoint(tiny / "st"), load_checkpoint(quantised)
    errors = [np.linalg.norm(q.f32(n) - bf.f32(n)) / np.linalg.norm(bf.f32(n)) for n in q.quantised]
    tokens = np.random.default_rng(5).integers(0, 512, 64)
    logits = {}
    for label, ck in (("bf16", bf), ("nvfp4", q), ("q4_0", load_checkpoint(q4_0))):
        ref = Reference(ck.config, ck)
        logits[label] = ref.forward(tokens, ref.new_state(len(tokens)))
    a = logits["bf16"]
    report = {}
    for label in ("nvfp4", "q4_0"):
        b = logits[label]
        cosine = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        report[label] = (cosine.min(), cosine.mean(), np.abs(a - b).max(), np.mean(a.argmax(1) == b.argmax(1)))
    with capsys.disabled():
        print(f"\ntiny, 64 teacher-forced positions vs BF16 (matrix rel. error {np.mean(errors):.4f}):")
        for label, (lo, mean, diff, top1) in report.items():
            print(f"  {label}: cosine min {lo:.4f} mean {mean:.4f}, max |diff| {diff:.4f}, top-1 {top1:.3f}")
    assert max(errors) < 0.1
    assert report["nvfp4"][1] > 0.92 and report["nvfp4"][3] >= 0.9
    assert report["nvfp4"][1] >= report["q4_0"][1]


def test_the_cpu_engine_generates_from_nvfp4(quantised):
    import lucegen

    with lucegen.LLM(quantised, device="cpu") as llm:
        out = llm.generate([1, 2, 3], max_tokens=6, ignore_eos=True)
    assert len(out.token_ids) == 6


def test_lucegen_run_on_the_cpu_generates_from_nvfp4(quantised, capsys):
    assert main(["run", "--model", str(quantised), "--device", "cpu", "--prompt", "hello world",
                 "--max-tokens", "4"]) == 0
    assert "4 generated on the numpy reference (CPU)" in capsys.readouterr().err


def test_a_gpu_engine_refuses_nvfp4_before_the_device(quantised):
    import lucegen
    from lucegen.runtime.host_device import HostDevice
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.target import load_target

    with pytest.raises(LucegenError, match="NVFP4 weights run on the CPU engine only") as info:
        lucegen.LLM(quantised, device="gpu")
    assert "\n" not in str(info.value)
    host = HostDevice(load_target("sm_90"))
    with pytest.raises(LucegenError, match="NVFP4 weights run on the CPU engine only"):
        lucegen.LLM(quantised, device=host)
    with pytest.raises(LucegenError, match="NVFP4 weights run on the CPU engine only"):
        MegakernelDecoder(quantised, device=host)
    assert host.allocated == 0 and not host.launches


@pytest.mark.parametrize("case", ["unknown format", "not a checkpoint", "already quantised", "gguf", "same dir"])
def test_quantize_bad_input_is_one_line(tiny, quantised, tmp_path, capsys, case):
    (tmp_path / "empty").mkdir()
    model, fmt, out = tiny / "st", "nvfp4", tmp_path / "out"
    if case == "unknown format":
        fmt = "q4_k_m"
    elif case == "not a checkpoint":
        model = tmp_path / "empty"
    elif case == "already quantised":
        model = quantised
    elif case == "gguf":
        model = tiny / "t.gguf"
    else:
        out = tiny / "st"
    assert main(["quantize", "--model", str(model), "--format", fmt, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lucegen: error:") and err.count("\n") == 1, err
    assert not out.exists() or out == tiny / "st"


def test_hf_quant_config_alone_marks_a_modelopt_directory(tiny, tmp_path):
    """Older ModelOpt exports name the algorithm in hf_quant_config.json only."""
    parts = _write_replica(tiny / "st", tmp_path / "q")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    (tmp_path / "q" / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                            "exclude_modules": ["lm_head"]}}))
    ck = load_checkpoint(tmp_path / "q")
    name = next(iter(parts))
    assert np.array_equal(ck.f32(name), _independent_dequantise(*parts[name]))
    (tmp_path / "q" / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    with pytest.raises(CheckpointError, match="quant_algo 'FP8': lucegen reads the NVFP4 ones only"):
        load_checkpoint(tmp_path / "q")
