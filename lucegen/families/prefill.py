"""The prefill kernel modules (templates/prefill/*.cu.j2) and the ``pf`` dict they render with: model shapes, the
descriptor's prefill tiles, and the compute type. One source of truth shared by every prefill kernel module, its
launcher (lucegen.runtime.prefill) and the tree verify kernels (lucegen.families.tree_verify). `lucegen build` renders
them for DEFAULT_MODEL on the descriptor and for QUANTISED_MODEL on its quantised-target variant; the runtime renders
the loaded model's own shape through the same functions."""

from __future__ import annotations

import dataclasses
import math

from ..errors import CheckpointError
from ..kernel_signature import KernelSignature, pointer, scalar, struct
from ..model.config import ModelConfig
from ..model.kv_cache import kv_format
from ..target import DTYPES, TILED_EPILOGUES, Target
from .base import KernelFamily, f32_literal

#: The model shape `lucegen build` renders the prefill kernels for on the descriptor (the BF16 engine).
DEFAULT_MODEL = "qwen3.5-0.8b"
#: The model shape `lucegen build` renders them for on the quantised-target variant (the GGUF engine).
QUANTISED_MODEL = "qwen3.5-27b"
#: GemmTensorMap (a CUtensorMap's 128 bytes): the A and W tile maps the TMA-fed wgmma GEMM kernels take (``tma``).
TMA_MAPS = (struct("map_a", "GemmTensorMap", 128, when="tma"), struct("map_w", "GemmTensorMap", 128, when="tma"))

#: The kernels' parameters, per module; ``{T}`` is the compute type, ``{OT}`` the output type, ``{KVT}`` the KV
#: cache's element type.
COMMON = (
    KernelSignature("prefill_embed", (
        pointer("tokens", "int", const=True), pointer("embed", "{T}", const=True),
        pointer("norm_w", "float", const=True), pointer("x", "float"), pointer("xn", "{T}"), pointer("ss", "float"),
        scalar("ss_stride", "int"),
    )),
)
ATTENTION = (
    KernelSignature("prefill_attention_prepare", (
        pointer("proj", "float", const=True), pointer("q_norm", "float", const=True),
        pointer("k_norm", "float", const=True), pointer("inv_freq", "float", const=True), pointer("kv", "{KVT}"),
        scalar("max_context", "int"), pointer("q_ws", "{T}"), scalar("n_tokens", "int"), scalar("pos0", "int"),
        pointer("depth", "int", const=True), pointer("pos0_at", "int", const=True),
    )),
    KernelSignature("prefill_attention", (
        pointer("q_ws", "{T}", const=True), pointer("proj", "float", const=True), pointer("kv", "{KVT}", const=True),
        scalar("max_context", "int"), pointer("out", "{T}"), scalar("n_tokens", "int"), scalar("pos0", "int"),
    )),
)
DELTANET = (
    KernelSignature("deltanet_conv_prepare", (
        pointer("proj", "float", const=True), pointer("conv_w", "float", const=True),
        pointer("conv_state", "float", const=True), pointer("a_log", "float", const=True),
        pointer("dt_bias", "float", const=True), pointer("workspace", "float"), scalar("n_tokens", "int"),
    )),
    KernelSignature("deltanet_chunk_prepare", (pointer("workspace", "float"), scalar("n_tokens", "int"))),
    KernelSignature("deltanet_chunk_scan", (
        pointer("workspace", "float"), pointer("recurrent", "float"), scalar("n_tokens", "int"),
    )),
    KernelSignature("deltanet_chunk_output", (pointer("workspace", "float"), scalar("n_tokens", "int"))),
    KernelSignature("deltanet_gated_norm", (
        pointer("proj", "float", const=True), pointer("gnorm_w", "float", const=True),
        pointer("workspace", "float", const=True), pointer("conv_state", "float"), pointer("out", "{OT}"),
        scalar("n_tokens", "int"),
    )),
)
GEMM = (
    KernelSignature("gemm_rows_f32_m{bm}", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), pointer("ss", "float", const=True),
        scalar("ss_parts", "int"), scalar("ss_stride", "int"), pointer("out", "float"), scalar("ldo", "int"),
        *TMA_MAPS,
    )),
    KernelSignature("gemm_swiglu_m{bm}", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), pointer("ss", "float", const=True),
        scalar("ss_parts", "int"), scalar("ss_stride", "int"), pointer("out", "{T}"), scalar("ldo", "int"),
        *TMA_MAPS,
    )),
    KernelSignature("gemm_residual_m{bm}", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), pointer("x", "float"), scalar("ldx", "int"),
        pointer("norm_w", "float", const=True), pointer("xn", "{T}"), scalar("ldxn", "int"), pointer("ss_out", "float"),
        scalar("ss_stride", "int"), *TMA_MAPS,
    )),
    KernelSignature("gemm_partial_m{bm}", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), scalar("splits", "int"), pointer("part", "float"),
        *TMA_MAPS,
    )),
    KernelSignature("gemm_residual_reduce", (
        pointer("part", "float", const=True), scalar("splits", "int"), scalar("M", "int"), scalar("N", "int"),
        pointer("x", "float"), scalar("ldx", "int"), pointer("norm_w", "float", const=True), pointer("xn", "{T}"),
        scalar("ldxn", "int"), pointer("ss_out", "float"), scalar("ss_stride", "int"),
    )),
    KernelSignature("gemm_rows_f32_reduce", (
        pointer("part", "float", const=True), scalar("splits", "int"), scalar("M", "int"), scalar("N", "int"),
        pointer("ss", "float", const=True), scalar("ss_parts", "int"), scalar("ss_stride", "int"),
        pointer("out", "float"), scalar("ldo", "int"),
    )),
    KernelSignature("gemv_rows_f32", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), pointer("ss", "float", const=True),
        scalar("ss_parts", "int"), scalar("ss_stride", "int"), pointer("out", "float"), scalar("ldo", "int"),
        pointer("argmax_key", "unsigned long long"),
    )),
)

#: (module name, template, its kernels' declarations): one kernel module per job.
MODULES = (
    ("prefill_common", "prefill/common.cu.j2", COMMON),
    ("prefill_gemm", "prefill/gemm.cu.j2", GEMM),
    ("prefill_deltanet", "prefill/deltanet.cu.j2", DELTANET),
    ("prefill_attention", "prefill/attention.cu.j2", ATTENTION),
)
GEMM_MODULE = "prefill_gemm"


def check_supported(config: ModelConfig, target: Target) -> None:
    """Shapes the prefill kernels handle; one clear error for anything else (before rendering)."""
    c = config
    rules = [
        (c.hidden_size % 8 == 0, "hidden_size must be a multiple of 8 (16-byte rows)"),
        (c.intermediate_size % 8 == 0, "intermediate_size must be a multiple of 8"),
        (c.linear_value_dim % 8 == 0, "the DeltaNet value dim must be a multiple of 8"),
        ((c.num_attention_heads * c.head_dim) % 8 == 0, "num_attention_heads * head_dim must be a multiple of 8"),
        (c.head_dim % 16 == 0, "head_dim must be a multiple of 16 (MMA fragments)"),
        (c.linear_key_head_dim % 16 == 0 and c.linear_value_head_dim % 16 == 0,
         "DeltaNet key/value head dims must be multiples of 16"),
        (c.rotary_dim % 2 == 0 and c.rotary_dim <= c.head_dim, "rotary_dim must be even and at most head_dim"),
        (c.conv_kernel >= 2, "conv_kernel must be at least 2"),
    ]
    for ok, reason in rules:
        if not ok:
            raise CheckpointError(f"model {c.name}: the prefill kernels cannot run this shape: {reason}")
    if target.compute_dtype not in ("bf16", "fp16"):
        raise CheckpointError(f"{target.name}: prefill needs compute_dtype bf16 or fp16")


def attention_tiling(config: ModelConfig, target: Target) -> dict:
    """The flash-attention kernel's shared-memory plan (templates/prefill/attention.cu.j2 and its launcher read it):
    a Q tile of ``block_q`` rows plus ``stages`` buffers of a K and a V tile of ``block_kv`` rows, each row
    head_dim + 8 elements (16 bytes of padding: conflict-free ldmatrix). Two stages where cp.async can fill one
    while the other is used, then the largest K/V tile (descriptor's block_kv, halved down to 16) that fits the
    chip's opt-in shared memory per block. ``simt`` (AMD) uses no dynamic shared memory."""
    pf, mm = target.prefill, target.matmul
    rows_q = pf.attention_block_q
    if rows_q % 16 or pf.attention_block_kv % 16:
        raise CheckpointError(f"{target.name}: [prefill] attention_block_q and attention_block_kv must be "
                              f"multiples of 16 (MMA fragments)")
    if mm.instruction == "simt":
        return {"attn_block_kv": pf.attention_block_kv, "attn_stages": 1, "attn_smem": 0}
    row_bytes = (config.head_dim + 8) * 2
    for stages in ((2, 1) if target.features.cp_async else (1,)):
        block_kv = pf.attention_block_kv
        while block_kv >= 16:
            smem = (rows_q + 2 * stages * block_kv) * row_bytes
            if smem <= target.smem_per_block_optin:
                return {"attn_block_kv": block_kv, "attn_stages": stages, "attn_smem": smem}
            block_kv //= 2
    raise CheckpointError(f"model {config.name}: head_dim {config.head_dim} attention tiles do not fit "
                          f"{target.name}'s {target.smem_per_block_optin} bytes of shared memory per block")


def prefill_params(config: ModelConfig, target: Target, v_heads: str = "grouped") -> dict:
    """Everything ``templates/prefill/*.cu.j2`` needs beyond the descriptor's own params. ``v_heads``: the order of
    the DeltaNet value heads in the weights and state, "grouped" (HF: key head g serves value heads g r .. g r + r - 1)
    or "tiled" (ggml: value head v NK + g serves key head g; a GGUF's quantised matrices keep it)."""
    check_supported(config, target)
    if v_heads not in ("grouped", "tiled"):
        raise ValueError(f"v_heads must be 'grouped' or 'tiled', got {v_heads!r}")
    c, mm, pf = config, target.matmul, target.prefill
    return {
        "model_name": c.name,
        "H": c.hidden_size, "I": c.intermediate_size, "V": c.vocab_size, "L": c.num_layers,
        "NH": c.num_attention_heads, "NKV": c.num_kv_heads, "HD": c.head_dim, "RD": c.rotary_dim,
        "NK": c.linear_num_key_heads, "NV": c.linear_num_value_heads,
        "DK": c.linear_key_head_dim, "DV": c.linear_value_head_dim, "CK": c.conv_kernel,
        "KD": c.linear_key_dim,  # NK * DK
        "VD": c.linear_value_dim,  # NV * DV
        "CD": c.conv_dim,  # 2 * KD + VD: the conv1d channels (q | k | v)
        "v_heads": v_heads,
        "NIN_DN": c.conv_dim + c.linear_value_dim + 2 * c.linear_num_value_heads,  # [qkv | z | a | b]
        "NIN_AT": c.q_proj_dim + 2 * c.kv_dim,  # [q_proj (per head query | gate) | k | v]
        "EPS": f32_literal(c.rms_norm_eps),
        "q_scale": f32_literal(1.0 / math.sqrt(c.linear_key_head_dim)),
        "attn_scale": f32_literal(c.head_dim ** -0.5),
        "dtype": target.compute_dtype,
        "ctype": DTYPES[target.compute_dtype][0],
        # the KV cache format (lucegen/model/kv_cache.py: KvFormat.template_params)
        **kv_format(target.kv_cache_type).template_params(),
        # the warp-level MMA of flash attention and the other mma.sync users (wgmma targets: m16n8k16, which
        # every sm_90 has) and the GEMM mainloop's own instruction (the descriptor's [matmul] instruction)
        "instruction": "mma_m16n8k16" if mm.instruction.startswith("wgmma") else mm.instruction,
        "gemm_instruction": mm.instruction,
        "tile_m": mm.tile_m, "tile_n": mm.tile_n, "tile_k": mm.tile_k, "warps": mm.warps, "stages": mm.stages,
        "cluster_m": mm.cluster_m, "schedule": mm.schedule,
        # epilogues with their own GEMM instance ([matmul.<epilogue>]): the [matmul] fields they replace
        "gemm_tilings": {ep: dataclasses.asdict(tiling) for ep, tiling in mm.tilings().items()},
        # RMSNorm partial sums of squares: one part per tile_n columns of the hidden size
        "ss_parts": math.ceil(c.hidden_size / mm.tile_n),
        "chunk": pf.deltanet_chunk,
        "block_q": pf.attention_block_q, "block_kv": pf.attention_block_kv,
        "max_tokens": pf.max_tokens,
        **attention_tiling(c, target),  # attn_block_kv, attn_stages, attn_smem
    }


def instance_params(pf: dict, epilogue: str) -> dict:
    """The template parameters of the GEMM instance an epilogue runs on: ``pf`` with that epilogue's own tiling from
    the descriptor (``[matmul.<epilogue>]``, in ``pf["gemm_tilings"]``) in place of ``[matmul]``'s."""
    return dict(pf, **pf["gemm_tilings"].get(epilogue, {}))


def module_name(pf: dict, epilogue: str) -> str:
    """``prefill_gemm`` for the [matmul] tiling, ``prefill_gemm_<epilogue>`` for an epilogue's own."""
    return f"{GEMM_MODULE}_{epilogue}" if epilogue in pf["gemm_tilings"] else GEMM_MODULE


def _params(target: Target, config: ModelConfig) -> dict:
    return {"pf": prefill_params(config, target)}


def _arch(target: Target) -> str | None:
    """The GEMM's wgmma mainloop needs the sm_90a target (architecture-specific instructions)."""
    return "sm_90a" if target.matmul.instruction.startswith("wgmma") else None


def _family(name: str, template: str, **kw) -> KernelFamily:
    return KernelFamily(name, template, shapes=(DEFAULT_MODEL,), quantised_shapes=(QUANTISED_MODEL,),
                        preset=ModelConfig.preset, **kw)


def _gemm_instance(epilogue: str) -> KernelFamily:
    """The GEMM instance of an epilogue with its own tiling (``[matmul.<epilogue>]``): rendered only for targets
    that have one."""
    return _family(f"{GEMM_MODULE}_{epilogue}", "prefill/gemm.cu.j2",
                   params=lambda t, config: {"pf": instance_params(_params(t, config)["pf"], epilogue)},
                   applies=lambda t: epilogue in t.matmul.tilings(), arch=_arch, signatures=GEMM)


FAMILIES = tuple(_family(name, template, params=_params, arch=_arch if name == GEMM_MODULE else lambda t: None,
                         signatures=signatures)
                 for name, template, signatures in MODULES) + tuple(_gemm_instance(ep) for ep in TILED_EPILOGUES)
