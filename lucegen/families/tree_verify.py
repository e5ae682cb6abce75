"""The DDTree verify kernels (templates/dflash/tree_verify.cu.j2): tree conv / delta rule / attention, per-row
argmax and the commit, rendered for the default model shape; the runtime renders the loaded model's own shape."""

from __future__ import annotations

from ..codegen import KernelFamily
from ..kernel_signature import KernelSignature, pointer, scalar
from .prefill import _params as _prefill_params

#: Threads per block of every tree kernel (the template's TV_NT).
THREADS = 256
#: Threads per block of tree_delta_rule (tuning choice: the template's TV_RULE_NT): 384 blocks of 16 value columns for
#: the 27B's 6,144, about 3 a compute unit of the H100's 132, where 192 blocks of 32 left 60 of them two, the rest
#: one, and a two-block compute unit's warps issue the step's instructions twice as long.
RULE_THREADS = 128
#: Value columns a warp of tree_delta_rule holds (tuning choice: the template's TV_RULE_CPW; 2 and 4 measured alike on
#: the H100, 4 kept).
RULE_COLUMNS_PER_WARP = 4
#: tree_delta_rule's slots a round (tuning choice: the template's TV_RULE_ROUND): a column's sums of o wait for the
#: round's end, so that the next slot's step does not wait behind them.
RULE_ROUND = 8
#: tree_attention's key streams a block, each an online softmax over every ATTENTION_STREAMS-th key (the template's
#: TV_AT_STREAMS; tuning choice): a warp a stream in tree_attention, since a one-slot pass at a 16K context is
#: latency-bound in the key walk (4 warps: 71 ms a token).
ATTENTION_STREAMS = 16
#: tree_attention_packed's streams a warp (the template's TV_AT_PACK; tuning choice): the same sums on a quarter of the
#: threads, for passes whose (slot, head) blocks are more than the chip holds of tree_attention's.
ATTENTION_PACK = 4
#: tree_attention's key split (tuning choice: the template's TV_AT_KEY_CHUNK): a (slot, head)'s keys go to
#: min(blocks, ceil(keys / chunk)) blocks of equal ranges, so that a long context's key walk spreads over the chip.
ATTENTION_KEY_CHUNK = 256
#: tree_attention's query heads a block while its keys are split, at most (tuning choice): the heads of one kv head
#: share each key's loads.
ATTENTION_MAX_HEADS = 3
#: tree_attention's key ranges per (slot, head), at most (tuning choice; 64 and 128 measured slower at 16K).
ATTENTION_MAX_RANGES = 32


def attention_heads(pf: dict) -> int:
    """tree_attention's query heads a block: the largest divisor of the GQA group up to ATTENTION_MAX_HEADS."""
    group = pf["NH"] // pf["NKV"]
    return max(d for d in range(1, min(group, ATTENTION_MAX_HEADS) + 1) if group % d == 0)


#: tree_attention_mma's slots a block, a warp each (tuning choice: the template's TA_SLOTS).
ATTENTION_SLOTS = 4
#: tree_attention_mma's keys a range, at least (tuning choice): a slot's keys go in ranges of a multiple of this many,
#: one block each, fixed by the key index so that a slot's sums do not depend on the tree.
ATTENTION_RANGE = 256
#: tree_attention_mma's key ranges a slot, at most (tuning choice): ranges of ATTENTION_RANGE keys up to this many
#: times as many keys, longer ranges beyond.
MMA_MAX_RANGES = 64
#: tree_attention_mma's grid, at most this many waves of the chip (tuning choice): the ranges beyond loop in a block.
MMA_WAVES = 8


def attention_ranges(keys: int) -> int:
    """tree_attention's (FMA) blocks per (slot, head) for slots of up to ``keys`` keys: enough ranges of
    ATTENTION_KEY_CHUNK keys, at most ATTENTION_MAX_RANGES. The kernel splits a slot's keys into
    min(blocks, ceil(keys / chunk)) ranges, so that split is the same for any grid of at least this many blocks."""
    return max(1, min(ATTENTION_MAX_RANGES, -(-keys // ATTENTION_KEY_CHUNK)))


def mma_range_keys(max_context: int) -> int:
    """tree_attention_mma's keys a range over a cache of ``max_context`` positions: the least multiple of
    ATTENTION_RANGE that covers the context in MMA_MAX_RANGES ranges (a multiple of every K/V tile)."""
    per = -(-max_context // MMA_MAX_RANGES)
    return ATTENTION_RANGE * max(1, -(-per // ATTENTION_RANGE))


def partial_ranges(pf: dict, target) -> int:
    """Key ranges a verify slot's partial softmax sums are allocated for, whatever the context: the most either
    rendered body splits a slot's keys into (lucegen/runtime/memory_plan.py counts them per slot)."""
    return max(ATTENTION_MAX_RANGES, MMA_MAX_RANGES if attention_tiling(pf, target)["ta_mma"] else 0)


def kv_raw_chunks(pf: dict) -> tuple[int, int] | None:
    """The copies (bytes: 16 or 4) that move a quantised cache's committed tile into shared memory as the cache holds
    it, (codes, scales): the widest whose every source address the layout aligns (rows of head_dim bits / 8 code
    bytes; the fp16 scales, head_dim / 32 a row, after all the codes). None for a float cache and where a row's
    scales are not whole 4-byte words (head_dim an odd multiple of 32)."""
    if not pf["kv_quantised"]:
        return None
    code_bytes, scale_bytes = pf["HD"] * pf["kv_bits"] // 8, pf["HD"] // 16
    if code_bytes % 4 or scale_bytes % 4:
        return None
    codes = 16 if code_bytes % 16 == 0 else 4
    scales = 16 if scale_bytes % 16 == 0 and code_bytes % 8 == 0 else 4  # the scales start 2 NKV max_context rows on
    return codes, scales


def attention_smem(pf: dict, block_kv: int, stages: int, slots: int) -> int:
    """Dynamic shared memory of the tensor-core tree_attention: its slots' query tile, ``stages`` K and V tiles of
    ``block_kv`` keys and the ``slots`` slots' own K and V rows, rows of head_dim + 8 two-byte values. A quantised
    cache: one K and V tile, and ``stages`` raw K and V tiles (codes and scales) that are dequantised into it."""
    quantised = pf["kv_quantised"]
    tiles, raw_row = (1, pf["HD"] * pf["kv_bits"] // 8 + pf["HD"] // 16) if quantised else (stages, 0)
    row_bytes = (pf["HD"] + 8) * 2
    return (16 * ATTENTION_SLOTS + 2 * tiles * block_kv + 2 * slots) * row_bytes + stages * 2 * block_kv * raw_row


def attention_tiling(pf: dict, target) -> dict:
    """tree_attention's bodies for the model of ``pf`` on ``target``: the FMA body always; tree_attention_mma
    (``ta_mma``, for the slots of at least ``ta_mma_keys`` keys: the descriptor's [ddtree] tensor_core_attention_keys)
    with the largest K/V tile of 64 keys, halved down to 16, whose one stage fits the opt-in shared memory beside the
    rows of the descriptor's tree budget (and holds the block's results: GROUP x head_dim floats a slot). A quantised
    KV cache's tiles come through shared memory as the cache holds them and are dequantised there (kv_raw_chunks:
    not for head_dims whose rows of scales are not whole words). No tensor-core body where the descriptor sets no key
    count, the chip has no tensor-core MMA or no tile fits. The choice depends on the descriptor and the KV format
    alone, not on a verifier's budget, so that every verifier of a chip computes a slot alike."""
    slots, group = target.ddtree.budget + 1, pf["NH"] // pf["NKV"]
    keys = target.ddtree.tensor_core_attention_keys
    if keys and pf["instruction"] != "simt" and group <= 16 and (not pf["kv_quantised"] or kv_raw_chunks(pf)):
        block_kv = 64
        while block_kv >= 16:
            stage_bytes = 2 * block_kv * (pf["HD"] + 8) * 2  # a K and a V tile
            if (attention_smem(pf, block_kv, 1, slots) <= target.smem_per_block_optin
                    and ATTENTION_SLOTS * group * pf["HD"] * 4 <= stage_bytes):
                return {"ta_mma": True, "ta_bkv": block_kv, "ta_mma_keys": keys}
            block_kv //= 2
    return {"ta_mma": False, "ta_bkv": 0, "ta_mma_keys": 0}


def gated_norm_quantises(pf: dict, target) -> bool:
    """Whether tree_gated_norm_q8 is rendered for the model of ``pf``: a quantised target's int8 activations
    (``pf["int8"]``), and value heads that tile a block of 256 values inside one block of the gated norm's warps (a
    warp a head)."""
    heads = 256 // pf["DV"] if 256 % pf["DV"] == 0 else 0
    return bool(pf.get("int8")) and heads > 0 and (THREADS // target.warp_size) % heads == 0 and \
        pf["VD"] % 256 == 0 and pf["DV"] % target.warp_size == 0


def template_params(pf: dict, target) -> dict:
    """The tree kernels' tiling for the model of ``pf`` on ``target``, given to the template by the family and by the
    runtime's own render alike."""
    return {"tv_threads": THREADS, "tv_rule_threads": RULE_THREADS, "tv_rule_cpw": RULE_COLUMNS_PER_WARP,
            "tv_rule_round": RULE_ROUND, "tv_at_streams": ATTENTION_STREAMS, "tv_at_pack": ATTENTION_PACK,
            "tv_at_key_chunk": ATTENTION_KEY_CHUNK, "tv_at_heads": attention_heads(pf), "ta_slots": ATTENTION_SLOTS,
            "kv_code_chunk": (kv_raw_chunks(pf) or (0, 0))[0], "kv_scale_chunk": (kv_raw_chunks(pf) or (0, 0))[1],
            "tv_norm_q8": gated_norm_quantises(pf, target), **attention_tiling(pf, target)}


def _params(target) -> dict:
    params = _prefill_params(target)
    return {**params, **template_params(params["pf"], target)}


#: tree_attention's parameters, shared by its packed twin (tree_attention_packed).
TREE_ATTENTION_PARAMS = (
    pointer("q_ws", "{OT}", const=True), pointer("proj", "float", const=True), pointer("kv", "{KVT}", const=True),
    scalar("max_context", "int"), pointer("anc", "int", const=True), scalar("anc_stride", "int"),
    pointer("depth", "int", const=True), pointer("out", "{OT}"), scalar("n_slots", "int"),
    pointer("pos0_at", "int", const=True), pointer("amax_out", "unsigned short"), pointer("partial", "float"),
    pointer("arrived", "unsigned"), scalar("mma_keys", "int"),
)

#: The kernels' parameters; ``{OT}`` is the compute type, ``{KVT}`` the KV cache's element type.
SIGNATURES = (
    KernelSignature("tree_conv_prepare", (
        pointer("proj", "float", const=True), pointer("conv_w", "float", const=True),
        pointer("conv_state", "float", const=True), pointer("a_log", "float", const=True),
        pointer("dt_bias", "float", const=True), pointer("parent", "int", const=True), pointer("workspace", "float"),
        pointer("windows", "float"), scalar("n_slots", "int"),
    )),
    KernelSignature("tree_delta_rule", (
        pointer("workspace", "float"), pointer("parent", "int", const=True), pointer("depth", "int", const=True),
        pointer("anc", "int", const=True), pointer("committed", "float", const=True), scalar("n_slots", "int"),
    )),
    KernelSignature("tree_gated_norm", (
        pointer("proj", "float", const=True), pointer("gnorm_w", "float", const=True),
        pointer("workspace", "float", const=True), pointer("out", "{OT}"), scalar("n_slots", "int"),
        pointer("amax_out", "unsigned short"),
    )),
    KernelSignature("tree_gated_norm_q8", (
        pointer("proj", "float", const=True), pointer("gnorm_w", "float", const=True),
        pointer("workspace", "float", const=True), scalar("n_slots", "int"), pointer("aq", "unsigned char"),
        pointer("a_da", "float"), scalar("group", "int"),
    )),
    KernelSignature("deltanet_decode_step", (
        pointer("proj", "float", const=True), pointer("conv_w", "float", const=True),
        pointer("window", "float", restrict=False), pointer("a_log", "float", const=True),
        pointer("dt_bias", "float", const=True), pointer("gnorm_w", "float", const=True),
        pointer("state", "float", restrict=False), pointer("out", "{OT}"), pointer("amax_out", "unsigned short"),
        pointer("arrived", "unsigned"),
    )),
    KernelSignature("tree_attention", TREE_ATTENTION_PARAMS),
    KernelSignature("tree_attention_packed", TREE_ATTENTION_PARAMS),
    KernelSignature("tree_attention_mma", (
        pointer("q_ws", "{OT}", const=True), pointer("proj", "float", const=True), pointer("kv", "{KVT}", const=True),
        scalar("max_context", "int"), pointer("anc", "int", const=True), scalar("anc_stride", "int"),
        pointer("depth", "int", const=True), pointer("out", "{OT}"), scalar("n_slots", "int"),
        pointer("pos0_at", "int", const=True), pointer("amax_out", "unsigned short"), pointer("partial", "float"),
        scalar("max_ranges", "int"), scalar("mma_keys", "int"), scalar("range_keys", "int"), scalar("stages", "int"),
    )),
    KernelSignature("tree_attention_merge", (
        pointer("proj", "float", const=True), pointer("depth", "int", const=True), pointer("out", "{OT}"),
        pointer("pos0_at", "int", const=True), pointer("amax_out", "unsigned short"),
        pointer("partial", "float", const=True), scalar("max_ranges", "int"), scalar("mma_keys", "int"),
        scalar("range_keys", "int"),
    )),
    KernelSignature("rows_argmax", (
        pointer("logits", "float", const=True), scalar("n_cols", "int"), pointer("partial_v", "float"),
        pointer("partial_i", "int"), pointer("arrived", "unsigned"), pointer("tokens", "int"),
    )),
    KernelSignature("tree_greedy_advance", (
        pointer("argmax", "int", const=True), pointer("tokens", "int"), pointer("pos0", "int"),
        pointer("history", "int"),
    )),
    KernelSignature("tree_commit_deltanet", (
        pointer("workspaces", "float"), scalar("ws_layer_stride", "size_t"), pointer("windows", "float", const=True),
        scalar("windows_layer_stride", "size_t"), pointer("recurrent", "float"), pointer("conv", "float"),
        pointer("path", "int", const=True), scalar("n", "int"), scalar("n_slots", "int"),
    )),
    KernelSignature("tree_commit_kv", (
        pointer("kv_all", "{KVT}"), scalar("layer_bytes", "size_t"), scalar("max_context", "int"),
        pointer("path", "int", const=True), scalar("n", "int"), scalar("pos0", "int"),
    )),
)

FAMILIES = (KernelFamily("tree_verify", "dflash/tree_verify.cu.j2", params=_params, signatures=SIGNATURES),)
