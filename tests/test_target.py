"""Chip descriptors: the nine shipped ones load; hypothesis-mutated ones are refused with the right field."""

from __future__ import annotations

import copy
import dataclasses
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.errors import DescriptorError, DeviceError
from lucegen.model.config import ModelConfig
from lucegen.target import TARGETS_DIR, Features, Target, list_targets, load_target, target_from_dict

NINE = ["sm_75", "sm_86", "sm_89", "sm_90", "sm_110", "sm_120", "sm_121", "gfx1100", "gfx1151"]
RAW = {name: tomllib.loads((TARGETS_DIR / f"{name}.toml").read_text()) for name in NINE}


def test_the_nine_chips_are_there_and_load():
    assert set(NINE) <= set(list_targets())
    for name in NINE:
        t = load_target(name)
        assert t.name == name
        assert t.megakernel.blocks == t.compute_units * t.megakernel.blocks_per_cu
        assert t.compute_dtype in t.dtypes


def test_key_figures():
    h100 = load_target("sm_90")
    assert (h100.compute_units, h100.mem_bandwidth_gbs, h100.l2_bytes) == (132, 3350, 50 * 2**20)
    assert (h100.smem_per_cu, h100.smem_per_block_optin) == (228 * 1024, 227 * 1024)
    assert h100.compute_capability == (9, 0) and h100.megakernel.blocks == 132
    rtx3090 = load_target("sm_86")
    assert (rtx3090.compute_units, rtx3090.mem_bandwidth_gbs) == (82, 936)
    assert load_target("sm_121").compute_capability == (12, 1)
    assert load_target("sm_75").dtypes == ("fp16",) and not load_target("sm_75").features.bf16
    assert (load_target("gfx1100").compute_units, load_target("gfx1100").warp_size) == (96, 32)
    assert load_target("gfx1151").compute_units == 40


def test_template_params_are_what_templates_need():
    p = load_target("sm_90").template_params()
    assert p["vendor"] == "nvidia" and p["is_nvidia"] and not p["is_amd"]
    assert p["ctypes"]["bf16"] == "bf16_t" and p["ctypes"]["fp16"] == "fp16_t"
    assert p["megakernel"] == {"blocks_per_cu": 1, "threads": 512, "blocks": 132}
    assert p["vector_width"] == 8 and p["warp_size"] == 32 and p["log2_warp_size"] == 5
    assert p["features"]["wgmma"] and not p["features"]["nvfp4"]
    assert load_target("gfx1100").template_params()["is_amd"]


def test_load_by_path_and_unknown_name(tmp_path):
    assert load_target(TARGETS_DIR / "sm_86.toml").name == "sm_86"
    with pytest.raises(DescriptorError, match="no such descriptor"):
        load_target("sm_999")
    bad = tmp_path / "broken.toml"
    bad.write_text("name = \n")
    with pytest.raises(DescriptorError, match="not valid TOML") as e:
        load_target(bad)
    assert str(bad) in str(e.value)


# ---- hypothesis: mutate a valid descriptor -------------------------------------------------------------------
def _schema_paths(cls=Target, prefix=""):
    """(dotted path, python type) for every field a descriptor file sets."""
    hints = {f.name: f.type for f in dataclasses.fields(cls)
             if not f.metadata.get("derived") and not f.metadata.get("optional")}  # (optional tables: own tests)
    import typing

    resolved = typing.get_type_hints(cls)
    for name in hints:
        hint = resolved[name]
        yield prefix + name, hint
        if dataclasses.is_dataclass(hint):
            yield from _schema_paths(hint, prefix + name + ".")


PATHS = list(_schema_paths())


def _get_parent(data, path):
    *tables, leaf = path.split(".")
    for t in tables:
        data = data[t]
    return data, leaf


def _wrong_values(hint):
    if dataclasses.is_dataclass(hint):
        return [1, "table", [1, 2]]
    if hint is bool:
        return [1, "true", [True]]
    if hint is int:
        return ["8", 8.5, True, [8]]
    if hint is float:
        return ["900", True, [900]]
    if hint is str:
        return [1, True, ["x"]]
    return ["bf16", 1, [1, 2]]  # tuple[str, ...]


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(NINE), index=st.integers(0, len(PATHS) - 1))
def test_missing_field_is_named(name, index):
    path, _hint = PATHS[index]
    data = copy.deepcopy(RAW[name])
    parent, leaf = _get_parent(data, path)
    del parent[leaf]
    with pytest.raises(DescriptorError) as e:
        target_from_dict(data, f"{name}.toml")
    assert e.value.field == path and e.value.reason == "missing"


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NINE), index=st.integers(0, len(PATHS) - 1), data=st.data())
def test_wrong_type_is_named(name, index, data):
    path, hint = PATHS[index]
    raw = copy.deepcopy(RAW[name])
    parent, leaf = _get_parent(raw, path)
    parent[leaf] = data.draw(st.sampled_from(_wrong_values(hint)))
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{name}.toml")
    assert e.value.field == path, e.value


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(NINE), table=st.sampled_from(["", "features.", "megakernel.", "matmul.", "ddtree."]),
       key=st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True), value=st.integers(1, 5))
def test_unknown_key_is_named(name, table, key, value):
    raw = copy.deepcopy(RAW[name])
    parent = raw[table[:-1]] if table else raw
    if key in parent or (table == "megakernel." and key == "blocks") or (not table and key == "path"):
        return
    parent[key] = value
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{name}.toml")
    assert e.value.field == table + key and "unknown key" in e.value.reason


def test_derived_value_in_file_is_refused():
    raw = copy.deepcopy(RAW["sm_90"])
    raw["megakernel"]["blocks"] = 132
    with pytest.raises(DescriptorError, match="derived") as e:
        target_from_dict(raw, "sm_90.toml")
    assert e.value.field == "megakernel.blocks"


INT_PATHS = [p for p, h in PATHS if h is int]


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(NINE), path=st.sampled_from(INT_PATHS), value=st.integers(-1000, 0))
def test_non_positive_integers_are_refused(name, path, value):
    raw = copy.deepcopy(RAW[name])
    parent, leaf = _get_parent(raw, path)
    parent[leaf] = value
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{name}.toml")
    assert e.value.field == path


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(NINE), warps=st.integers(1, 32), remainder=st.integers(1, 31))
def test_threads_not_a_multiple_of_the_warp_size(name, warps, remainder):
    raw = copy.deepcopy(RAW[name])
    raw["megakernel"]["threads"] = warps * raw["warp_size"] + remainder
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{name}.toml")
    assert e.value.field == "megakernel.threads" and "multiple of warp_size" in e.value.reason


@settings(max_examples=50, deadline=None)
@given(name=st.sampled_from(NINE), extra_warps=st.integers(1, 64))
def test_threads_over_the_block_limit(name, extra_warps):
    raw = copy.deepcopy(RAW[name])
    raw["megakernel"]["threads"] = raw["max_threads_per_block"] + extra_warps * raw["warp_size"]
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{name}.toml")
    assert e.value.field == "megakernel.threads" and "exceeds" in e.value.reason


@settings(max_examples=50, deadline=None)
@given(name=st.sampled_from(NINE), extra=st.integers(1, 1 << 20))
def test_shared_memory_over_the_chip_limit(name, extra):
    raw = copy.deepcopy(RAW[name])
    raw["smem_per_block_optin"] = raw["smem_per_cu"] + extra
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{name}.toml")
    assert e.value.field == "smem_per_block_optin"
    raw = copy.deepcopy(RAW[name])
    raw["matmul"]["stages"] = 64  # 64 pipeline stages of tiles never fit
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{name}.toml")
    assert e.value.field == "matmul.stages"


@pytest.mark.parametrize("chip,feature", [
    ("sm_75", "bf16"), ("sm_75", "cp_async"), ("sm_86", "fp8"), ("sm_89", "nvfp4"), ("sm_90", "nvfp4"),
    ("sm_89", "tma"), ("sm_120", "wgmma"), ("sm_121", "wgmma"), ("gfx1100", "fp8"), ("gfx1151", "tma"),
    ("gfx1100", "wgmma"), ("gfx1151", "nvfp4"), ("sm_89", "programmatic_launch"), ("gfx1100", "programmatic_launch"),
])
def test_feature_the_arch_lacks_is_refused(chip, feature):
    raw = copy.deepcopy(RAW[chip])
    raw["features"][feature] = True
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{chip}.toml")
    assert e.value.field == f"features.{feature}" and chip in e.value.reason


@pytest.mark.parametrize("chip,dtype", [("sm_75", "bf16"), ("sm_86", "fp8"), ("sm_90", "nvfp4"), ("gfx1100", "fp8")])
def test_dtype_the_arch_lacks_is_refused(chip, dtype):
    raw = copy.deepcopy(RAW[chip])
    raw["dtypes"] = raw["dtypes"] + [dtype]
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{chip}.toml")
    assert e.value.field == "dtypes" and dtype in e.value.reason


def test_other_impossible_values():
    cases = [
        ("sm_90", {"vendor": "intel"}, "vendor"),
        ("sm_90", {"arch": "gfx1100"}, "arch"),
        ("sm_90", {"arch": "sm_70"}, "arch"),
        ("sm_90", {"warp_size": 64}, "warp_size"),
        ("gfx1100", {"warp_size": 48}, "warp_size"),
        ("sm_90", {"compute_dtype": "fp8"}, "compute_dtype"),
        ("sm_90", {"kv_cache_type": "nvfp4"}, "kv_cache_type"),
        ("sm_90", {"dtypes": ["bf16", "bf16", "fp16"]}, "dtypes"),
        ("sm_90", {"dtypes": ["fp16"]}, "compute_dtype"),
        ("sm_90", {"smem_per_block": 300000}, "smem_per_block"),
        ("sm_90", {"name": "sm_91"}, "name"),
        ("sm_90", {"mem_bandwidth_gbs": float("nan")}, "mem_bandwidth_gbs"),
    ]
    for chip, change, field in cases:
        raw = copy.deepcopy(RAW[chip])
        raw.update(change)
        with pytest.raises(DescriptorError) as e:
            target_from_dict(raw, f"{chip}.toml")
        assert e.value.field == field, (change, e.value)


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(NINE), cus=st.integers(1, 400), data=st.data())
def test_valid_variations_load_and_derive(name, cus, data):
    raw = copy.deepcopy(RAW[name])
    warp, limit = raw["warp_size"], min(raw["max_threads_per_block"], raw["max_threads_per_cu"])
    threads = warp * data.draw(st.integers(1, limit // warp))
    blocks_per_cu = data.draw(st.integers(1, raw["max_threads_per_cu"] // threads))
    raw.update(compute_units=cus)
    raw["megakernel"].update(threads=threads, blocks_per_cu=blocks_per_cu)
    dropped = data.draw(st.sampled_from([f for f in dataclasses.fields(Features) if f.name != "bf16"])).name
    raw["features"][dropped] = False  # leaving a supported feature off is always allowed...
    if dropped in raw["dtypes"] and dropped != raw["compute_dtype"]:
        raw["dtypes"].remove(dropped)  # ...with its dtype dropped too
    if dropped == "tma":  # ...with the pingpong GEMM instances that need it
        for ep in [k for k, v in raw["matmul"].items() if isinstance(v, dict) and v.get("schedule") == "pingpong"]:
            del raw["matmul"][ep]
    t = target_from_dict(raw, f"{name}.toml")
    assert t.megakernel.blocks == cus * blocks_per_cu and t.megakernel.threads == threads


def test_descriptor_error_message_names_file_field_reason():
    raw = copy.deepcopy(RAW["sm_86"])
    raw["megakernel"]["threads"] = 500
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, "targets/sm_86.toml")
    assert str(e.value) == "targets/sm_86.toml: megakernel.threads: 500 is not a multiple of warp_size 32"


# ---- picking a descriptor for a device (no GPU needed: detection result passed in) ----------------------------
def test_match_target_picks_and_refuses():
    from lucegen.runtime.device import match_target

    assert match_target("sm_90", 132, "H100").name == "sm_90"
    assert match_target("sm_86", 82).name == "sm_86"
    with pytest.raises(DeviceError, match=r"no descriptor for sm_89 with 100 SMs.*new-target NAME --like sm_89"):
        match_target("sm_89", 100, "RTX 4080")
    with pytest.raises(DeviceError, match="is for sm_86, but the device .* is sm_90"):
        match_target("sm_90", 132, "H100", target="sm_86")
    with pytest.raises(DeviceError, match="compute_units = 132"):
        match_target("sm_90", 114, "H100 PCIe", target="sm_90")


@pytest.mark.parametrize("chip, value, message", [
    ("sm_90", 3, "is not 1 or 2"),
    ("sm_86", 2, "needs the TMA-fed wgmma mainloop"),
    ("gfx1100", 2, "needs the TMA-fed wgmma mainloop"),
])
def test_matmul_cluster_m_is_checked(tmp_path, chip, value, message):
    from lucegen import TARGETS_DIR
    from lucegen.errors import DescriptorError

    text = (TARGETS_DIR / f"{chip}.toml").read_text()
    lines = [(f"cluster_m = {value}" if line.startswith("cluster_m =") else line) for line in text.splitlines()]
    path = tmp_path / f"{chip}.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DescriptorError) as e:
        load_target(path)
    assert e.value.field == "matmul.cluster_m" and message in e.value.reason


# ---- per-epilogue GEMM instances ([matmul.<epilogue>]) -----------------------------------------------------------
_TILING = {"tile_m": 64, "tile_n": 256, "tile_k": 64, "warps": 8, "stages": 4, "schedule": "pingpong"}


@pytest.mark.parametrize("chip, table, change, field, message", [
    ("sm_90", "swiglu", {"schedule": "zigzag"}, "matmul.swiglu.schedule", "not one of"),
    ("sm_90", "swiglu", {"tile_m": 128}, "matmul.swiglu.schedule", "tile_m = 64"),
    ("sm_90", "rows_f32", {"stages": 9}, "matmul.rows_f32.stages", "shared memory"),
    ("sm_90", "rows_f32", {"tile_n": 200}, "matmul.rows_f32.tile_n", "multiple of 16"),
    ("sm_89", "swiglu", {}, "matmul.swiglu.schedule", "TMA-fed wgmma"),
    ("sm_90", "residual", {}, "matmul.residual", "unknown key"),
    ("sm_90", "swiglu", {"tile_k": None}, "matmul.swiglu.tile_k", "missing"),
])
def test_epilogue_tiling_is_checked(chip, table, change, field, message):
    data = copy.deepcopy(RAW[chip])
    tiling = {k: v for k, v in {**_TILING, **change}.items() if v is not None}
    data["matmul"][table] = tiling
    with pytest.raises(DescriptorError) as e:
        target_from_dict(data, f"{chip}.toml")
    assert e.value.field == field and message in e.value.reason, (e.value.field, e.value.reason)


def test_epilogue_tiling_is_optional_and_kept():
    data = copy.deepcopy(RAW["sm_90"])
    tables = {k for k, v in data["matmul"].items() if isinstance(v, dict)}
    assert tables and load_target("sm_90").matmul.tilings().keys() == tables
    for k in tables:
        del data["matmul"][k]
    assert target_from_dict(data, "sm_90.toml").matmul.tilings() == {}
    data["matmul"]["rows_f32"] = dict(_TILING, schedule="cooperative", tile_m=128)
    assert target_from_dict(data, "sm_90.toml").matmul.rows_f32.tile_m == 128


# ---- the quantised target's compute type ([quant]) ----------------------------------------------------------------
def test_quant_table_sets_the_quantised_targets_compute_type():
    """[quant] compute_dtype: the descriptor the quantised GGUF target renders with computes (and keeps a float KV
    cache) in it, and its sources go to generated/<target>/quant/; without the table it is the descriptor itself."""
    from lucegen import codegen

    t = load_target("sm_90")
    q = t.quantised_target()
    assert (t.compute_dtype, t.quant_compute_dtype) == ("bf16", "fp16")
    assert (q.compute_dtype, q.kv_cache_type, q.variant, q.name) == ("fp16", "fp16", "quant", "sm_90")
    fam = codegen.family("quant_gemm")
    assert codegen.generated_path(q, fam).parent == codegen.generated_path(t, fam).parent / "quant"
    assert "#define QG_FOLD 1" in codegen.render_family(q, fam)
    assert "#define QG_FOLD 0" in codegen.render_family(t, fam)
    assert "megakernel" in {f.name for f in codegen.families(t)} - {f.name for f in codegen.families(q)}
    data = copy.deepcopy(RAW["sm_90"])
    del data["quant"]
    plain = target_from_dict(data, "sm_90.toml")
    assert plain.quantised_target() is plain and plain.quant_compute_dtype == "bf16"
    data["quant"] = {"compute_dtype": "bf16"}
    same = target_from_dict(data, "sm_90.toml")
    assert same.quantised_target() is same


def test_int8_activations_give_the_quantised_variant_its_int8_kernels():
    """[quant] int8_activations on: the fp16 variant renders quant_gemm_nt<N>q (mma m16n8k32 s8) and nt1q at its other
    residencies (nt1q_r4), the one-token kernels at both (m1q, m1q_r4), the prequantised nt<N>qp for prequantised_nt,
    and their twins for groups holding Q6_K (nt<N>q6, m1q6.., nt<N>q6p), the descriptor's own bf16 render does not;
    without the key (off) the variant has none."""
    from lucegen import codegen
    from lucegen.families.quant_gemm import NT_MAX, instances

    data = copy.deepcopy(RAW["sm_90"])
    data["quant"]["int8_activations"] = True
    t = target_from_dict(data, "sm_90.toml")
    q = t.quantised_target()
    names = ([f"nt{n}q" for n in range(1, NT_MAX + 1)] + [f"nt{n}qp" for n in t.tuning.quant_gemm.prequantised_nt]
             + ["nt1q_r4", "m1q", "m1q_r4"])
    assert [k.name for k in instances(q) if k.int8] == names + [n.replace("q", "q6") for n in names]
    assert [k.own_types for k in instances(q) if k.int8] == [False] * len(names) + [True] * len(names)
    assert [k.one_row for k in instances(q) if k.int8] == [n.startswith("m1") for n in names] * 2
    assert [k.prequantised for k in instances(q) if k.int8] == [n.endswith("p") for n in names] * 2
    one_group = ("nt1q", "nt1q_r4", "nt1q6", "nt1q6_r4", "m1q", "m1q_r4", "m1q6", "m1q6_r4")
    by_name = {k.name: k.blocks_per_cu for k in instances(q)}
    assert [by_name[n] for n in one_group] == [3, 4, 3, 4, 3, 4, 3, 4]
    source = codegen.render_family(q, codegen.family("quant_gemm"))
    assert "m16n8k32.row.col.s32.s8.s8.s32" in source and "m16n8k32.row.col.s32.u8.s8.s32" in source
    assert not any(k.int8 for k in instances(t))
    del data["quant"]["int8_activations"]
    assert not any(k.int8 for k in instances(target_from_dict(data, "sm_90.toml").quantised_target()))


def test_quantised_variant_renders_only_what_differs():
    """`lucegen build` writes a family for the quantised-target variant only where its render differs from the
    target's own: quant_gemm (QG_FOLD) does, small_kernels (no compute type) does not."""
    from lucegen.commands.build import render_units

    units = render_units([load_target("sm_90")])
    variant = {u.family.name for u in units if u.target.variant == "quant"}
    assert "quant_gemm" in variant and "small_kernels" not in variant
    assert "small_kernels" in {u.family.name for u in units if u.target.variant != "quant"}


@pytest.mark.parametrize("chip, quant, field, message", [
    ("sm_90", {"compute_dtype": "fp8"}, "quant.compute_dtype", "not one of"),
    ("sm_75", {"compute_dtype": "bf16"}, "quant.compute_dtype", "not in dtypes"),
    ("sm_90", {"compute_dtype": 16}, "quant.compute_dtype", "expected a string"),
    ("sm_90", {}, "quant.compute_dtype", "missing"),
    ("sm_90", {"kv_cache_type": "fp16", "compute_dtype": "fp16"}, "quant.kv_cache_type", "unknown key"),
    ("sm_75", {"compute_dtype": "fp16", "int8_activations": True}, "quant.int8_activations", "sm_80+"),
    ("gfx1100", {"compute_dtype": "fp16", "int8_activations": True}, "quant.int8_activations", "sm_80+"),
    ("sm_90", {"compute_dtype": "bf16", "int8_activations": True}, "quant.int8_activations", "fp16"),
    ("sm_90", {"compute_dtype": "fp16", "int8_activations": 1}, "quant.int8_activations", "expected a boolean"),
])
def test_quant_table_is_checked(chip, quant, field, message):
    data = copy.deepcopy(RAW[chip])
    data["quant"] = quant
    with pytest.raises(DescriptorError) as e:
        target_from_dict(data, f"{chip}.toml")
    assert e.value.field == field and message in e.value.reason, (e.value.field, e.value.reason)


@pytest.mark.parametrize("value", [None, 0, 3])
def test_amd_descriptor_states_its_simds(value):
    """clang budgets an AMD kernel's VGPRs per SIMD, so an AMD descriptor says how many SIMDs share a CU: missing,
    zero, or not dividing the CU's waves is refused, naming simds_per_cu."""
    data = copy.deepcopy(RAW["gfx1100"])
    if value is None:
        del data["simds_per_cu"]
    else:
        data["simds_per_cu"] = value
    with pytest.raises(DescriptorError) as e:
        target_from_dict(data, "gfx1100.toml")
    assert e.value.field == "simds_per_cu", (e.value.field, e.value.reason)


def test_megakernel_waves_per_simd_follow_the_descriptor():
    """The AMD megakernel asks clang for the waves its blocks put on each SIMD: 512 threads of wave32 over 2 SIMDs."""
    from lucegen.families.megakernel import kernel_params

    t = load_target("gfx1100")
    params = kernel_params(ModelConfig.preset("tiny"), t)
    assert params["waves_per_simd"] == 512 // 32 // 2
    assert kernel_params(ModelConfig.preset("tiny"), load_target("sm_90"))["waves_per_simd"] == 0
