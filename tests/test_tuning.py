"""A descriptor's [tuning.<family>] tables (lucegen/tuning.py): defaults where a chip states none, one clear error for
an impossible value, and a family that renders and launches what its chip's tuning says."""

from __future__ import annotations

import copy
import dataclasses
import tomllib
import types

import pytest

from lucegen import codegen
from lucegen.cli import main
from lucegen.errors import DescriptorError
from lucegen.families import quant_gemm, tree_verify
from lucegen.target import TARGETS_DIR, list_targets, load_target, target_from_dict
from lucegen.tuning import DEFAULTS, parse_tuning

RAW = {name: tomllib.loads((TARGETS_DIR / f"{name}.toml").read_text()) for name in list_targets()}


class Module:
    """What TreeAttention asks of a loaded module: its functions by name, one block of each a compute unit."""

    class Function:
        def set_max_dynamic_smem(self, n: int) -> None:
            pass

        def max_active_blocks_per_cu(self, block_threads: int, smem: int = 0) -> int:
            return 1

    def function(self, name: str, programmatic: bool = False):
        return self.Function()


def with_tuning(chip: str, table: str | None = None, **values):
    """``chip``'s descriptor with ``values`` set in [tuning.<table>] (no table: its [tuning] left out)."""
    data = copy.deepcopy(RAW[chip])
    if table is None:
        data.pop("tuning", None)
    else:
        data.setdefault("tuning", {}).setdefault(table, {}).update(values)
    return target_from_dict(data, f"{chip}.toml")


def all_keys() -> list[str]:
    return [f"{table}.{key}" for table, values in DEFAULTS.items() for key in values]


def test_the_checks_know_the_families_kernels():
    """lucegen/tuning.py cannot import the families (they sit above it); what its checks assume of their kernels is
    held equal to the families' constants here."""
    from lucegen import tuning

    assert tuple(tuning._QUANT_GEMM_NT) == tuple(range(1, quant_gemm.NT_MAX + 1))
    assert tuning._RING_TYPES == quant_gemm.K_QUANTS and tuning._INT8_WARPS == quant_gemm.Q8_WARPS
    assert tuning._ATTENTION_PACK == tree_verify.ATTENTION_PACK


def test_a_descriptor_without_tuning_takes_every_default():
    untuned = [name for name in list_targets() if "tuning" not in RAW[name]]
    assert "sm_86" in untuned and "gfx1100" in untuned and "sm_90" not in untuned
    defaults = parse_tuning(None, "<defaults>")
    assert sorted(defaults.defaults) == sorted(all_keys())
    for name in untuned:
        t = load_target(name)
        assert t.tuning == defaults, name
    qg = load_target("sm_86").tuning.quant_gemm
    assert (qg.staged_nt, qg.ring_types, qg.wgmma_nt, qg.prequantised_nt, qg.int8_wave_time) == ((), (), (), (), ())
    assert load_target("sm_86").tuning.tree_verify.rule_threads == DEFAULTS["tree_verify"]["rule_threads"]


def test_the_h100_states_every_value_and_differs_from_the_defaults():
    """sm_90 takes nothing from the defaults, and its measured values are not what an unmeasured chip gets."""
    t = load_target("sm_90")
    assert t.tuning.defaults == ()
    assert t.tuning != dataclasses.replace(parse_tuning(None, "<defaults>"), defaults=())
    assert t.tuning.quant_gemm.int8_wave_time == ((4, 1.19),) and t.tuning.tree_verify.rule_threads == 128


def test_keys_left_out_take_their_default_one_by_one():
    t = with_tuning("sm_86", "quant_gemm", ring_stages=4)
    assert t.tuning.quant_gemm.ring_stages == 4
    assert "quant_gemm.ring_stages" not in t.tuning.defaults
    assert sorted(t.tuning.defaults) == sorted(k for k in all_keys() if k != "quant_gemm.ring_stages")
    assert t.tuning.quant_gemm.staged_nt == ()  # the rest: defaults


def test_untuned_chips_render_no_optional_quant_gemm_variant():
    """Without [tuning.quant_gemm] a chip renders the plain kernels alone: no staged, ring, wgmma, prequantised or
    other-residency twins, even where it has cp.async, wgmma and int8 activations (sm_90 less its tuning)."""
    bare = with_tuning("sm_90").quantised_target()
    names = {k.name for k in quant_gemm.instances(bare)}
    assert {"m1", "nt1", "nt4", "nt1q", "nt4q", "m1q", "m1q6"} <= names
    assert not {k for k in names if k.endswith(("s", "r", "w", "p")) or "_r" in k}, names
    tuned = {k.name for k in quant_gemm.instances(load_target("sm_90").quantised_target())}
    assert {"nt2s", "nt3s", "m1r", "nt2w", "nt3w", "nt2qp", "nt4q6p", "nt1q_r4", "m1q_r4"} <= tuned
    for name in ("sm_86", "sm_120"):  # cp.async, yet no staged or ring kernel of their own
        assert {k.name for k in quant_gemm.instances(load_target(name))} == {"m1", "nt1", "nt2", "nt3", "nt4"}


def test_a_tuning_value_changes_the_quant_gemm_render():
    base = load_target("sm_90")
    source = codegen.render_family(base, codegen.family("quant_gemm"))
    assert "#define QG_RING_STAGES 3" in source and "#define QG_WG_STAGES 2" in source
    deeper = with_tuning("sm_90", "quant_gemm", ring_stages=4, wgmma_stages=3, staged_nt=[2])
    source = codegen.render_family(deeper, codegen.family("quant_gemm"))
    assert "#define QG_RING_STAGES 4" in source and "#define QG_WG_STAGES 3" in source
    names = [k.name for k in quant_gemm.instances(deeper)]
    assert "nt2s" in names and "nt3s" not in names and "quant_gemm_nt3s" not in source
    assert quant_gemm.ring_smem_bytes(deeper, 3360) == 4 * quant_gemm.ring_smem_bytes(base, 3360) // 3
    assert quant_gemm.wgmma_smem_bytes(deeper, 2, 2) == 3 * quant_gemm.wgmma_smem_bytes(base, 2, 2) // 2


def test_int8_residencies_follow_the_wave_time_table():
    t = with_tuning("sm_90", "quant_gemm", int8_wave_time={"4": 1.19, "5": 1.5}).quantised_target()
    assert quant_gemm.q8_wave_time(t) == {3: 1.0, 4: 1.19, 5: 1.5}
    by_name = {k.name: k.blocks_per_cu for k in quant_gemm.instances(t)}
    assert by_name["nt1q_r5"] == 5 and by_name["m1q6_r5"] == 5 and by_name["nt1q"] == 3
    source = codegen.render_family(t, codegen.family("quant_gemm"))
    assert f"{quant_gemm.kernel_name('nt1q_r5', 'rows_f32')}(" in source


def test_the_launcher_chooses_by_its_chips_tuning():
    """The runtime-only values (not rendered): the prequantised kernels' largest launch and the staging threshold."""
    from lucegen.runtime.host_device import HostDevice
    from lucegen.runtime.quant_gemm import QuantGemm

    def gemm(target):
        return QuantGemm(HostDevice(target), target, 5120, 1e-6, max_k=5120)

    int8 = types.SimpleNamespace(tiles=320, pair=False, int8=True, K=5120, types=["Q4_K"])
    h100 = load_target("sm_90").quantised_target()
    assert gemm(h100).kernel(int8, 100, 0, 5120)[0] == "nt4qp"  # 100 rows: within 128
    fewer = with_tuning("sm_90", "quant_gemm", prequantised_rows=64).quantised_target()
    assert gemm(fewer).kernel(int8, 100, 0, 5120)[0] == "nt4q"  # over 64: quantised as it loads
    assert gemm(fewer).kernel(int8, 64, 0, 5120)[0] == "nt4qp"

    # the in-projection at 23 rows, 2 K parts: 4 row tiles a block x 3 token groups = 12 reuses
    floats = types.SimpleNamespace(tiles=1030, pair=False, int8=False, K=5120, types=["Q4_K"],
                                   warpgroup_types_uniform=False, largest_tile_block=2304)
    qg = gemm(load_target("sm_90"))
    assert qg.parts(floats) == 2 and qg.kernel(floats, 23, 0, 5120)[0] == "nt3s"
    qg = gemm(with_tuning("sm_90", "quant_gemm", stage_min_reuse=16))
    assert qg.kernel(floats, 23, 0, 5120)[0] == "nt3"


def test_a_tuning_value_changes_the_tree_verify_render_and_launches():
    from lucegen.model.config import ModelConfig
    from lucegen.families.prefill import prefill_params
    from lucegen.runtime.tree_attention import TreeAttention

    base = load_target("sm_90")
    params = tree_verify.template_params(prefill_params(ModelConfig.preset("qwen3.5-27b"), base), base)
    assert (params["tv_rule_threads"], params["tv_rule_round"], params["tv_at_streams"]) == (128, 8, 16)
    t = with_tuning("sm_90", "tree_verify", rule_threads=256, rule_round=4, attention_streams=8)
    pf = prefill_params(ModelConfig.preset("qwen3.5-27b"), t)
    params = tree_verify.template_params(pf, t)
    assert (params["tv_rule_threads"], params["tv_rule_round"], params["tv_at_streams"]) == (256, 4, 8)
    source = codegen.render_family(t, codegen.family("tree_verify"), "qwen3.5-27b")
    assert "#define TV_RULE_NT 256" in source and "#define TV_AT_STREAMS 8" in source
    att = TreeAttention(Module(), t, pf, slots=23, max_context=4096)
    assert att.fma_kernel(1)[1] == 8 * t.warp_size and att.fma_kernel(10 ** 4)[1] == 2 * t.warp_size
    # tree_attention_mma's grid: at most mma_waves waves of one block a compute unit, split over slot groups and heads
    one = TreeAttention(Module(), with_tuning("sm_90", "tree_verify", mma_waves=1), pf, slots=23, max_context=65536)
    eight = TreeAttention(Module(), base, pf, slots=23, max_context=65536)
    (_, one_ranges, _), _ = one._mma_grid(23)
    (_, eight_ranges, _), _ = eight._mma_grid(23)
    assert one_ranges < eight_ranges <= eight.mma_ranges


@pytest.mark.parametrize("chip, table, values, field, message", [
    ("sm_90", "quant_gemm", {"ring_stages": 1}, "quant_gemm.ring_stages", "not 2 to 8"),
    ("sm_90", "quant_gemm", {"ring_stages": 0}, "quant_gemm.ring_stages", "must be positive"),
    ("sm_90", "quant_gemm", {"ring_stages": 2.5}, "quant_gemm.ring_stages", "expected an integer"),
    ("sm_90", "quant_gemm", {"ring_types": ["Q8_0"]}, "quant_gemm.ring_types", "not one of"),
    ("sm_90", "quant_gemm", {"ring_types": "Q6_K"}, "quant_gemm.ring_types", "array of strings"),
    ("sm_90", "quant_gemm", {"ring_types": ["Q6_K", "Q6_K"]}, "quant_gemm.ring_types", "twice"),
    ("sm_90", "quant_gemm", {"staged_nt": [5]}, "quant_gemm.staged_nt", "1 to 4"),
    ("sm_90", "quant_gemm", {"staged_nt": [3, 2]}, "quant_gemm.staged_nt", "increasing"),
    ("sm_90", "quant_gemm", {"wgmma_nt": [0]}, "quant_gemm.wgmma_nt", "must be positive"),
    ("sm_90", "quant_gemm", {"prequantised_nt": [1]}, "quant_gemm.prequantised_nt", "2 to 4"),
    ("sm_90", "quant_gemm", {"prequantised_rows": 100}, "quant_gemm.prequantised_rows", "multiple of 32"),
    ("sm_90", "quant_gemm", {"wgmma_stages": 5}, "quant_gemm.wgmma_stages", "2 to 4"),
    ("sm_90", "quant_gemm", {"wgmma_buffers": 3}, "quant_gemm.wgmma_buffers", "1 or 2"),
    ("sm_90", "quant_gemm", {"int8_wave_time": {"x": 1.0}}, "quant_gemm.int8_wave_time", "not a positive integer"),
    ("sm_90", "quant_gemm", {"int8_wave_time": {"4": -1.0}}, "quant_gemm.int8_wave_time", "positive finite"),
    ("sm_90", "quant_gemm", {"int8_wave_time": {"17": 2.0}}, "quant_gemm.int8_wave_time", "max_threads_per_cu"),
    ("sm_90", "quant_gemm", {"int8_wave_time": [1.19]}, "quant_gemm.int8_wave_time", "table"),
    ("sm_90", "quant_gemm", {"ring_depth": 3}, "quant_gemm.ring_depth", "unknown key"),
    ("sm_90", "tree_verify", {"rule_threads": 100}, "tree_verify.rule_threads", "multiple of warp_size 32"),
    ("sm_86", "tree_verify", {"rule_threads": 2048}, "tree_verify.rule_threads", "max_threads_per_block"),
    ("gfx1100", "tree_verify", {"attention_streams": 6}, "tree_verify.attention_streams", "power of two"),
    ("sm_90", "tree_verify", {"attention_streams": 64}, "tree_verify.attention_streams", "max_threads_per_block"),
    ("sm_90", "tree_verify", {"rule_round": 33}, "tree_verify.rule_round", "over 32"),
    ("sm_90", "tree_verify", {"mma_waves": 0}, "tree_verify.mma_waves", "must be positive"),
])
def test_an_impossible_tuning_value_is_one_error_naming_file_and_field(chip, table, values, field, message):
    with pytest.raises(DescriptorError) as e:
        with_tuning(chip, table, **values)
    assert e.value.field == f"tuning.{field}" and message in e.value.reason, (e.value.field, e.value.reason)
    assert str(e.value).startswith(f"{chip}.toml: tuning.{field}: ")


@pytest.mark.parametrize("tuning, field, message", [
    ({"prefill": {"max_tokens": 1}}, "tuning.prefill", "unknown table"),
    ({"quant_gemm": 3}, "tuning.quant_gemm", "expected a table"),
    (5, "tuning", "expected a table"),
])
def test_a_malformed_tuning_table_is_named(tuning, field, message):
    data = copy.deepcopy(RAW["sm_86"])
    data["tuning"] = tuning
    with pytest.raises(DescriptorError) as e:
        target_from_dict(data, "sm_86.toml")
    assert e.value.field == field and message in e.value.reason


def test_show_prints_the_resolved_tuning_and_marks_defaults(capsys):
    assert main(["show", "sm_86"]) == 0
    out = capsys.readouterr().out
    assert "\n[tuning.quant_gemm]\nstaged_nt = []    # default (lucegen/tuning.py)\n" in out
    assert "int8_wave_time = {}    # default" in out and "rule_threads = 256    # default" in out
    assert main(["show", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "int8_wave_time = { 4 = 1.19 }\n" in out and "rule_threads = 128\n" in out and "# default" not in out


def test_new_target_leaves_the_like_chips_tuning_out(tmp_path, monkeypatch):
    """A descriptor started from the H100's takes the defaults, not the H100's measured tuning."""
    import lucegen.target

    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", str(tmp_path))
    assert main(["new-target", "h100pcie", "--like", "sm_90", "--dir", str(tmp_path)]) == 0
    text = (tmp_path / "h100pcie.toml").read_text()
    assert "\n[tuning" not in text and "[quant]" in text and "int8_activations = true" in text
    made = lucegen.target.load_target(tmp_path / "h100pcie.toml")
    assert made.tuning == parse_tuning(None, "<defaults>")


def test_an_untuned_h100_verifies_on_the_host_device(tmp_path):
    """The H100 less its [tuning] tables (int8 activations without the prequantised and other-residency kernels, the
    default tree tilings): its quantised engine prefills and verifies on HostDevice, every launch checked against the
    compiled kernels, and frees what it allocated."""
    import numpy as np

    from lucegen.model.config import ModelConfig
    from lucegen.model.init_gguf import write_gguf_checkpoint
    from lucegen.runtime import ddtree
    from lucegen.runtime.host_device import HostDevice
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    write_gguf_checkpoint(ModelConfig.preset("tiny-q"), tmp_path / "tiny-q.gguf", quant="q4_k_m", seed=0,
                          progress=False)
    dev = HostDevice(with_tuning("sm_90"))
    dev.reply = lambda buffer, dtype, shape: np.zeros(shape, dtype)
    dec = QuantDecoder(tmp_path / "tiny-q.gguf", device=dev, max_context=512)
    pre = Prefiller(dec)
    pre.prefill(np.arange(40, dtype=np.int32) % dec.config.vocab_size)
    ver = TreeVerifier(dec, budget=16)
    ver.verify(ddtree.chain(np.arange(16) % dec.config.vocab_size), 1)  # 17 slots: nt3q
    ver.verify(ddtree.chain(np.arange(1)), 1)  # 2 slots: nt1q
    launched = {name for name, *_ in dev.launches}
    tiles = {t for t in (k.name for k in quant_gemm.instances(dec.target))
             if any(quant_gemm.kernel_name(t, e) in launched for e in quant_gemm.EPILOGUES)}
    assert {"tree_delta_rule", "tree_attention"} <= launched and {"nt3q", "nt1q"} <= tiles, launched
    assert not {t for t in tiles if t.endswith(("p", "_r4", "r", "s", "w"))}
    for part in (ver, pre, dec):
        part.close()
    assert dev.allocated == 0
