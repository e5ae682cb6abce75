"""The numpy float32 reference of a DFlash draft's forward: the oracle the device draft is tested against.

It states z-lab/dflash ``dflash/model.py`` (``DFlashDraftModel.forward``, ``Qwen3DFlashAttention``) as used by its
``dflash_generate`` loop, one block at a time::

    ctx   = hidden_norm(fc(concat_i target_hidden[layer_i]))        # per committed position, once
    per draft layer l, per committed position p:                     # the draft's KV cache, kept across blocks
        K_ctx[l][p] = rope(k_norm(k_proj_l(ctx[p])), p),  V_ctx[l][p] = v_proj_l(ctx[p])
    x = target.embed_tokens([root, mask, ..., mask])                 # block_size rows at positions start ..
    per draft layer l:
        h = rms_norm(x, input_layernorm)                             # Qwen3 RMSNorm: x * rsqrt(mean x^2 + eps) * w
        q = rope(q_norm(q_proj(h)));  K = [K_ctx | rope(k_norm(k_proj(h)))];  V = [V_ctx | v_proj(h)]
        x = x + o_proj(softmax(q K^T / sqrt(head_dim)) V)             # GQA; non-causal inside the block
        x = x + down(silu(gate(h2)) * up(h2)),  h2 = rms_norm(x, post_attention_layernorm)
    logits = target.lm_head(rms_norm(x, norm))[1:]                   # the block_size - 1 drafted positions

The block's own keys are not kept (``past_key_values_draft.crop(start)`` after every block). ``window`` bounds the
context the draft sees to the last ``window`` committed positions (the device keeps a ring of that many rows); a
``sliding_attention`` layer applies its own window on top, and a causal layer (``layer_is_causal``) lets block row i
see block keys 0..i only.

``gemm_inputs="bf16"`` rounds where the device does: every projection input (the captured target hidden states, the
normed rows entering a GEMM as round(x * w) * rsqrt(mean x^2 + eps)), the cached and block keys/values, the queries,
the attention output and the SwiGLU activation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dflash import DFlashConfig
from .reference import F32, _DictWeights, apply_rope, norm_input, round_to, silu


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Qwen3RMSNorm: x * rsqrt(mean(x^2) + eps) * w (the weight itself, no 1 + w)."""
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(var + F32(eps))).astype(F32) * w


def draft_inv_freq(config: DFlashConfig) -> np.ndarray:
    """inv_freq[i] = 1 / theta^(2i / head_dim): the draft ropes whole heads (Qwen3RotaryEmbedding)."""
    exponent = np.arange(0, config.head_dim, 2, dtype=F32) / F32(config.head_dim)
    return (F32(1) / np.power(F32(config.rope_theta), exponent)).astype(F32)


def log_softmax_topk(logits: np.ndarray, k: int, multiplier: float = 1.0, softcap: float | None = None):
    """Per row: z = logits * multiplier (then softcap * tanh(z / softcap) when set), log_softmax(z), the k best
    (log-probabilities descending, their token ids); ties toward the lower id."""
    z = np.asarray(logits, F32) * F32(multiplier)
    if softcap:
        z = F32(softcap) * np.tanh(z / F32(softcap))
    m = z.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True))
    lp = (z - lse).astype(F32)
    order = np.argsort(-lp, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(lp, order, axis=-1), order.astype(np.int64)


@dataclass
class DraftContext:
    """The draft's context cache: per layer K and V [positions, kv_heads, head_dim] of every committed position."""

    keys: list[np.ndarray]
    values: list[np.ndarray]
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def length(self) -> int:
        return int(self.positions.size)


class DraftReference:
    """``DraftReference(config, checkpoint, embed, lm_head)``: ``checkpoint`` has ``f32(name)`` (or is a mapping) over
    the draft's tensor names; ``embed`` / ``lm_head`` are the target's [vocab, hidden] matrices."""

    def __init__(self, config: DFlashConfig, checkpoint, embed: np.ndarray, lm_head: np.ndarray, *,
                 gemm_inputs: str = "f32", window: int | None = None):
        if gemm_inputs not in ("f32", "bf16", "fp16"):
            raise ValueError(f"gemm_inputs must be f32, bf16 or fp16, got {gemm_inputs!r}")
        self.config, self.gemm_inputs, self.window = config, gemm_inputs, window
        source = _DictWeights(checkpoint) if not hasattr(checkpoint, "f32") else checkpoint
        self.w = {name: np.ascontiguousarray(source.f32(name), F32) for name in config.tensor_shapes()}
        self.embed = np.asarray(embed, F32)
        self.lm_head = np.asarray(lm_head, F32)
        self.inv_freq = draft_inv_freq(config)

    def _round(self, x: np.ndarray) -> np.ndarray:
        return x if self.gemm_inputs == "f32" else round_to(x, self.gemm_inputs)

    def _norm_in(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """rms_norm(x, w) entering a projection (reference.norm_input: rounded like the GEMM epilogue)."""
        return norm_input(x, w, self.config.rms_norm_eps, self.gemm_inputs)

    def _head_norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return rms_norm(x, self.w[name], self.config.rms_norm_eps)

    # -------------------------------------------------------------------------------------- context
    def new_context(self) -> DraftContext:
        c = self.config
        empty = np.zeros((0, c.num_kv_heads, c.head_dim), F32)
        return DraftContext([empty] * c.num_layers, [empty] * c.num_layers)

    def features(self, hidden: dict[int, np.ndarray]) -> np.ndarray:
        """``extract_context_feature``: the target's hidden states after the tapped layers, concatenated [T, n*H]
        (``hidden`` as :meth:`Reference.forward` returns it)."""
        return np.concatenate([hidden[i] for i in self.config.target_layer_ids], axis=-1).astype(F32)

    def add_context(self, ctx: DraftContext, features: np.ndarray, positions) -> None:
        """Append committed positions: their target features [T, n*H] become every layer's context K/V."""
        c = self.config
        positions = np.asarray(positions, np.int64).reshape(-1)
        h = self._norm_in(self._round(features) @ self.w["fc.weight"].T, self.w["hidden_norm.weight"])
        t = h.shape[0]
        for l in range(c.num_layers):
            p = f"layers.{l}.self_attn."
            k = (h @ self.w[p + "k_proj.weight"].T).reshape(t, c.num_kv_heads, c.head_dim)
            v = (h @ self.w[p + "v_proj.weight"].T).reshape(t, c.num_kv_heads, c.head_dim)
            k = apply_rope(self._head_norm(k, p + "k_norm.weight"), positions, self.inv_freq)
            ctx.keys[l] = np.concatenate([ctx.keys[l], self._round(k)])
            ctx.values[l] = np.concatenate([ctx.values[l], self._round(v)])
        ctx.positions = np.concatenate([ctx.positions, positions])

    # -------------------------------------------------------------------------------------- one block
    def block_logits(self, ctx: DraftContext, root: int, start: int) -> np.ndarray:
        """The draft's logits [block_size - 1, vocab] for positions start + 1 .. after the root at ``start``."""
        c = self.config
        B = c.block_size
        tokens = np.full(B, c.mask_token_id, np.int64)
        tokens[0] = root
        positions = start + np.arange(B)
        x = self.embed[tokens].astype(F32) * F32(c.input_embedding_scale)
        for l in range(c.num_layers):
            p = f"layers.{l}."
            h = self._norm_in(x, self.w[p + "input_layernorm.weight"])
            x = x + self.attention(l, h, ctx, positions)
            h = self._norm_in(x, self.w[p + "post_attention_layernorm.weight"])
            gate = h @ self.w[p + "mlp.gate_proj.weight"].T
            up = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + self._round(silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        return self._norm_in(x[1:], self.w["norm.weight"]) @ self.lm_head.T

    def attention(self, l: int, h: np.ndarray, ctx: DraftContext, positions: np.ndarray) -> np.ndarray:
        c = self.config
        p = f"layers.{l}.self_attn."
        B, hd = h.shape[0], c.head_dim
        q = (h @ self.w[p + "q_proj.weight"].T).reshape(B, c.num_attention_heads, hd)
        k = (h @ self.w[p + "k_proj.weight"].T).reshape(B, c.num_kv_heads, hd)
        v = (h @ self.w[p + "v_proj.weight"].T).reshape(B, c.num_kv_heads, hd)
        q = self._round(apply_rope(self._head_norm(q, p + "q_norm.weight"), positions, self.inv_freq))
        k = self._round(apply_rope(self._head_norm(k, p + "k_norm.weight"), positions, self.inv_freq))
        keys = np.concatenate([ctx.keys[l], k])  # [L + B, kv, hd]
        values = np.concatenate([ctx.values[l], self._round(v)])
        key_pos = np.concatenate([ctx.positions, positions])
        allowed = np.ones((B, key_pos.size), bool)
        if self.window is not None:  # the ring: only the last `window` committed positions
            allowed[:, : ctx.length] &= ctx.positions[None, :] >= positions[0] - self.window
        if c.layer_is_causal(l):
            allowed &= key_pos[None, :] <= positions[:, None]
        span = c.layer_window(l)
        if span is not None:
            allowed &= positions[:, None] - key_pos[None, :] < span
        group = c.num_attention_heads // c.num_kv_heads
        kh = np.repeat(keys, group, axis=1)  # q head h reads kv head h // group
        vh = np.repeat(values, group, axis=1)
        scores = np.einsum("bhd,jhd->hbj", q, kh) * F32(hd ** -0.5)
        scores = np.where(allowed[None], scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = (scores / scores.sum(axis=-1, keepdims=True)).astype(F32)
        out = np.einsum("hbj,jhd->bhd", probs, vh).reshape(B, -1)
        return self._round(out) @ self.w[p + "o_proj.weight"].T

    def propose(self, ctx: DraftContext, root: int, start: int, k: int):
        """Top-``k`` rows (log-probabilities [block_size - 1, k], token ids) of the block after ``root``."""
        c = self.config
        return log_softmax_topk(self.block_logits(ctx, root, start), k, c.output_multiplier,
                                c.final_logit_softcapping)
