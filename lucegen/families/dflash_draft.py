"""The DFlash draft's kernels (templates/dflash/draft.cu.j2) and the ``dp`` dict they render with, for a draft shape:
`lucegen build` renders the published draft of the 27B target (DEFAULT_DRAFT), the runtime the loaded draft's own."""

from __future__ import annotations

from ..errors import CheckpointError
from ..kernel_signature import KernelSignature, pointer, scalar
from ..model.dflash import DFlashConfig
from ..target import DTYPES, Target
from .base import KernelFamily, f32_literal

#: The draft shape `lucegen build` renders for.
DEFAULT_DRAFT = "dflash-qwen3.5-27b"
TOPK_MAX = 8  # DR_TOPK_MAX: the most candidates per drafted position


def draft_params(config: DFlashConfig, target: Target) -> dict:
    """The ``dp`` dict ``templates/dflash/draft.cu.j2`` renders with; one clear error for shapes it cannot run."""
    c = config
    if c.head_dim % target.warp_size:
        raise CheckpointError(f"draft {c.name}: head_dim {c.head_dim} must be a multiple of {target.name}'s warp "
                              f"size {target.warp_size}")
    for key, value in (("hidden_size", c.hidden_size), ("intermediate_size", c.intermediate_size),
                       ("q heads x head_dim", c.q_dim), ("kv heads x head_dim", c.kv_dim)):
        if value % 8:
            raise CheckpointError(f"draft {c.name}: {key} = {value} must be a multiple of 8 (16-byte GEMM rows)")
    if target.compute_dtype not in ("bf16", "fp16"):
        raise CheckpointError(f"{target.name}: the draft needs compute_dtype bf16 or fp16")
    return {
        "draft_name": c.name, "H": c.hidden_size, "TAPS": len(c.target_layer_ids), "NH": c.num_attention_heads,
        "NKV": c.num_kv_heads, "HD": c.head_dim, "B": c.block_size, "L": c.num_layers,
        "EPS": f32_literal(c.rms_norm_eps), "attn_scale": f32_literal(c.head_dim ** -0.5),
        "ctype": DTYPES[target.compute_dtype][0], "TOPK_MAX": TOPK_MAX,
    }


#: The kernels' parameters; ``{T}`` is the compute type.
SIGNATURES = (
    KernelSignature("draft_capture", (
        pointer("x", "float", const=True), pointer("capture", "{T}"), scalar("tap", "int"),
    )),
    KernelSignature("draft_context_store", (
        pointer("ctx_kv", "float", const=True), pointer("rows", "int", const=True), scalar("n", "int"),
        pointer("n_at", "int", const=True), scalar("pos0", "int"), pointer("pos0_at", "int", const=True),
        pointer("k_norm", "float", const=True), pointer("inv_freq", "float", const=True), pointer("cache", "{T}"),
        scalar("ring", "int"),
    )),
    KernelSignature("draft_block_prepare", (
        pointer("proj", "float", const=True), pointer("q_norm", "float", const=True),
        pointer("k_norm", "float", const=True), pointer("inv_freq", "float", const=True),
        pointer("start_at", "int", const=True), pointer("q_ws", "{T}"), pointer("block_kv", "{T}"),
    )),
    KernelSignature("draft_attention", (
        pointer("q_ws", "{T}", const=True), pointer("cache", "{T}", const=True), scalar("ring", "int"),
        pointer("block_kv", "{T}", const=True), pointer("start_at", "int", const=True), scalar("causal", "int"),
        scalar("window", "int"), pointer("out", "{T}"),
    )),
    KernelSignature("draft_topk_partial", (
        pointer("logits", "float", const=True), scalar("n_cols", "int"), scalar("multiplier", "float"),
        scalar("softcap", "float"), scalar("chunk_cols", "int"), pointer("cand", "dr_cand"), pointer("part", "float2"),
    )),
    KernelSignature("draft_topk_merge", (
        pointer("cand", "dr_cand", const=True), pointer("part", "float2", const=True), scalar("chunks", "int"),
        scalar("k", "int"), pointer("lp_out", "float"), pointer("tok_out", "int"),
    )),
)

def _params(target: Target, config: DFlashConfig) -> dict:
    return {"dp": draft_params(config, target)}


FAMILIES = (KernelFamily("dflash_draft", "dflash/draft.cu.j2", params=_params, shapes=(DEFAULT_DRAFT,),
                         quantised_shapes=(DEFAULT_DRAFT,), preset=DFlashConfig.preset, signatures=SIGNATURES),)
