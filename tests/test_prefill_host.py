"""Host-side pieces of the prefill: the FLOP count the benchmark reports, its GEMM shape list, the pf params, and
the `lucegen bench prefill` / `lucegen run --prefill` argument checks (no GPU needed)."""

from __future__ import annotations

import math

import pytest

from lucegen.bench.prefill import gemm_shapes, matmul_flops
from lucegen.cli import main
from lucegen.errors import CheckpointError
from lucegen.families.prefill import prefill_params
from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import write_hf_checkpoint
from lucegen.target import list_targets, load_target


@pytest.mark.parametrize("preset", ["tiny", "tiny-gqa", "qwen3.5-0.8b"])
def test_matmul_flops_counts_every_projection_weight(preset):
    """2 FLOPs per weight per token over every 2-D layer weight (from the checkpoint's tensor shapes, an
    independent listing), plus causal attention and one lm_head row."""
    c = ModelConfig.preset(preset)
    T = 37
    weights = sum(math.prod(shape) for name, shape in c.tensor_shapes().items()
                  if name.startswith("layers.") and len(shape) == 2)
    n_attn = sum(1 for k in c.layer_types if k == "full_attention")
    attention = n_attn * 4 * c.num_attention_heads * c.head_dim * T * (T + 1) / 2
    assert matmul_flops(c, T) == pytest.approx(2 * T * weights + attention + 2 * c.vocab_size * c.hidden_size)


def test_gemm_shapes_of_the_08b_prompt():
    shapes = gemm_shapes(ModelConfig.preset("qwen3.5-0.8b"), 520)
    assert (520, 8224, 1024, "rows_f32") in shapes  # DeltaNet in-projection [qkv | z | a | b]
    assert (520, 5120, 1024, "rows_f32") in shapes  # attention [q+gate | k | v]
    assert (520, 7168, 1024, "swiglu") in shapes and (520, 1024, 3584, "residual") in shapes
    assert (1, 248320, 1024, "rows_f32") in shapes  # the lm_head row


@pytest.mark.parametrize("name", list_targets())
def test_prefill_params_for_every_target(name):
    t = load_target(name)
    pf = prefill_params(ModelConfig.preset("qwen3.5-0.8b"), t)
    assert pf["ss_parts"] == math.ceil(1024 / t.matmul.tile_n)
    assert pf["CD"] + pf["VD"] + 2 * pf["NV"] == pf["NIN_DN"] == 8224
    assert pf["chunk"] == t.prefill.deltanet_chunk


def test_prefill_params_refuse_odd_shapes():
    import dataclasses

    c = dataclasses.replace(ModelConfig.preset("tiny"), head_dim=72)
    with pytest.raises(CheckpointError, match="head_dim must be a multiple of 16"):
        prefill_params(c, load_target("sm_90"))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pf-cli") / "tiny"
    write_hf_checkpoint(ModelConfig.preset("tiny"), out, seed=0, progress=False)
    return out


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--tokens", "0"], "--tokens must be positive"),
])
def test_bench_prefill_refuses_bad_counts(tiny_dir, capsys, argv, message):
    code = main(["bench", "prefill", "--model", str(tiny_dir), "--no-hf", *argv])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("name", list_targets())
def test_residual_split_k_plan(name):
    """Split K only where the residual GEMM's blocks leave the chip idle (short prompts), always into whole k-tiles."""
    from lucegen.runtime.prefill.gemm import block_heights, crews, plan_residual

    t = load_target(name)
    pf = prefill_params(ModelConfig.preset("qwen3.5-0.8b"), t)
    heights, n = block_heights(pf, t), crews(pf, t)
    for M in (1, 37, 520, 4096, 8192):
        for K in (2048, 3584):
            bm, split = plan_residual(M, 1024, K, pf, t, heights, n)
            assert bm in heights and K % (split * pf["tile_k"]) == 0
    if name == "sm_90":
        assert plan_residual(37, 1024, 3584, pf, t, heights, n)[1] > 1
        assert plan_residual(8192, 1024, 3584, pf, t, heights, n)[1] == 1
