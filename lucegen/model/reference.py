"""The numpy float32 reference of a Qwen3.5 text model: the oracle every kernel is tested against.

It follows Hugging Face transformers' ``modeling_qwen3_5.py`` (``Qwen3_5ForCausalLM``) operation by operation and
is meant to be read as the spec of the model::

    x = embed_tokens[tokens]
    for each layer i:
        h = rms_norm_1p(x, input_layernorm)                       # x * rsqrt(mean(x^2) + eps) * (1 + w)
        x = x + (gated_delta_net(h) if layer i is linear_attention else gated_attention(h))
        x = x + swiglu_mlp(rms_norm_1p(x, post_attention_layernorm))   # down(silu(gate(x)) * up(x))
    logits = rms_norm_1p(x, norm) @ lm_head.T                     # lm_head = embed_tokens when tied

Prefill (many tokens) and decode (one token) are the same call; the state advances in place. Per attention layer the
state holds the KV cache (after k-norm and RoPE), per DeltaNet layer the conv window (the last ``conv_kernel - 1``
inputs of the causal conv, oldest first) and the recurrent state ``S`` [value_heads, key_dim, value_dim].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .config import FULL, ModelConfig
from .dtypes import round_to
from .kv_cache import kv_format, stored
from .quant import q8_dequantized

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; the pure-numpy loop is the fallback
    numba = None

F32 = np.float32


# ------------------------------------------------------------------------------------------------ state
@dataclass
class AttentionCache:
    """KV cache of one full-attention layer: k, v [num_kv_heads, T, head_dim] (k after k_norm and RoPE)."""

    _k: np.ndarray
    _v: np.ndarray
    length: int = 0

    @property
    def k(self) -> np.ndarray:
        return self._k[:, : self.length]

    @property
    def v(self) -> np.ndarray:
        return self._v[:, : self.length]

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [num_kv_heads, T_new, head_dim]."""
        need = self.length + k.shape[1]
        if need > self._k.shape[1]:  # grow (a max_len given to new_state avoids this)
            cap = max(need, 2 * self._k.shape[1], 16)
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = np.zeros((old.shape[0], cap, old.shape[2]), F32)
                new[:, : self.length] = old[:, : self.length]
                setattr(self, name, new)
        self._k[:, self.length : need] = k
        self._v[:, self.length : need] = v
        self.length = need


@dataclass
class DeltaNetState:
    """conv: [conv_dim, conv_kernel - 1] the last inputs of the causal conv, oldest first;
    recurrent: [num_value_heads, key_head_dim, value_head_dim] float32 (HF's layout)."""

    conv: np.ndarray
    recurrent: np.ndarray


@dataclass
class ReferenceState:
    layers: list  # per layer: AttentionCache or DeltaNetState
    position: int = 0  # number of tokens consumed so far = position of the next token
    extra: dict = field(default_factory=dict)

    def copy(self) -> ReferenceState:
        import copy

        return copy.deepcopy(self)


# ------------------------------------------------------------------------------------------------ math pieces
def rms_norm_1p(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Qwen3_5RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), over the last axis (weights are zero-centred)."""
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(var + F32(eps))).astype(F32) * (F32(1) + w)


def gated_rms_norm(x: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Qwen3_5RMSNormGated: x * rsqrt(mean(x^2) + eps) * w * silu(z) (the weight is used directly, no +1)."""
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(var + F32(eps))).astype(F32) * w * silu(z)


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (F32(1) / (F32(1) + np.exp(-x))).astype(F32)


def softplus(x: np.ndarray) -> np.ndarray:
    """torch.nn.functional.softplus (beta 1, threshold 20)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(F32)


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """FLA's l2norm: x * rsqrt(sum(x^2) + eps) over the last axis."""
    return (x / np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True) + F32(eps))).astype(F32)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """inv_freq[i] = 1 / theta^(2i / rotary_dim), i < rotary_dim / 2 (computed in float32 like HF)."""
    rd = config.rotary_dim
    exponent = np.arange(0, rd, 2, dtype=F32) / F32(rd)
    return (F32(1) / np.power(F32(config.rope_theta), exponent)).astype(F32)


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotary embedding on the first rotary_dim dims of each head (rotate_half convention), rest passes through.
    x: [T, heads, head_dim]; positions: [T]."""
    rd = 2 * inv_freq.shape[0]
    freqs = positions.astype(F32)[:, None] * inv_freq[None, :]  # [T, rd/2]
    angles = np.concatenate([freqs, freqs], axis=-1)  # [T, rd]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    rot, rest = x[..., :rd], x[..., rd:]
    half = rd // 2
    rotated_half = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return np.concatenate([rot * cos + rotated_half * sin, rest], axis=-1).astype(F32)


def causal_conv1d_silu(x: np.ndarray, window: np.ndarray, w: np.ndarray):
    """Depthwise causal conv (no bias) then SiLU. x: [T, C] new inputs; window: [C, K-1] previous inputs (oldest
    first); w: [C, K] (conv1d.weight squeezed). out[t, c] = silu(sum_j w[c, j] * seq[t + j, c]) where seq is the
    window followed by x. Returns (out [T, C], new window [C, K-1])."""
    k = w.shape[1]
    seq = np.concatenate([window.T, x], axis=0)  # [K-1+T, C]
    t = x.shape[0]
    out = np.zeros_like(x)
    for j in range(k):
        out += seq[j : j + t] * w[:, j]
    return silu(out.astype(F32)), np.ascontiguousarray(seq[-(k - 1) :].T) if k > 1 else window


def _gated_delta_rule_numpy(q, k, v, g, beta, state):
    """The recurrent gated delta rule (HF torch_recurrent_gated_delta_rule), per token t and value head h:
        S = S * exp(g[t, h]);  kv_mem = S^T k;  delta = (v - kv_mem) * beta;  S = S + k delta^T;  o = S^T q
    q, k: [T, H, dk] (already repeated to value heads, l2-normalised, q scaled); v: [T, H, dv]; g, beta: [T, H];
    state: [H, dk, dv] updated in place. Returns o [T, H, dv]."""
    out = np.empty_like(v)
    for t in range(q.shape[0]):
        state *= np.exp(g[t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", state, k[t])
        delta = (v[t] - kv_mem) * beta[t][:, None]
        state += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", state, q[t])
    return out


if numba is not None:

    @numba.njit(cache=True, fastmath=False)
    def _gated_delta_rule_numba(q, k, v, g, beta, state):  # same math as _gated_delta_rule_numpy
        T, H, dk = q.shape
        dv = v.shape[2]
        out = np.empty((T, H, dv), np.float32)
        kv_mem = np.empty(dv, np.float32)
        for h in range(H):
            s = state[h]
            for t in range(T):
                decay = np.float32(np.exp(g[t, h]))
                for i in range(dk):
                    for j in range(dv):
                        s[i, j] *= decay
                for j in range(dv):
                    kv_mem[j] = 0.0
                for i in range(dk):
                    ki = k[t, h, i]
                    for j in range(dv):
                        kv_mem[j] += s[i, j] * ki
                for j in range(dv):
                    kv_mem[j] = (v[t, h, j] - kv_mem[j]) * beta[t, h]  # now delta
                for i in range(dk):
                    ki = k[t, h, i]
                    for j in range(dv):
                        s[i, j] += ki * kv_mem[j]
                for j in range(dv):
                    out[t, h, j] = 0.0
                for i in range(dk):
                    qi = q[t, h, i]
                    for j in range(dv):
                        out[t, h, j] += s[i, j] * qi
        return out


def gated_delta_rule(q, k, v, g, beta, state):
    args = [np.ascontiguousarray(a, dtype=F32) for a in (q, k, v, g, beta)]
    if numba is not None and state.flags.c_contiguous and state.dtype == F32:
        return _gated_delta_rule_numba(*args, state)
    return _gated_delta_rule_numpy(*args, state)


# ------------------------------------------------------------------------------------------------ the model
class _DictWeights:
    def __init__(self, tensors: Mapping):
        self.tensors = tensors

    def f32(self, name):
        return np.asarray(self.tensors[name], dtype=F32)


def norm_input(x: np.ndarray, gain: np.ndarray, eps: float, gemm_inputs: str = "f32", int8: bool = False) -> np.ndarray:
    """An RMSNorm with weight ``gain`` (1 + w for Qwen3.5's zero-centred norms, w for Qwen3's) as a projection's
    input: x * rsqrt(mean x^2 + eps) * gain; with ``gemm_inputs`` "bf16" / "fp16", round(x * gain) * rsqrt(...),
    the order in which the prefill GEMM epilogue applies it; ``int8``: round(x * gain) int8-rounded per 256 values
    (quant.q8_dequantized) before the row scale, as the int8-activation GEMM takes it."""
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    if gemm_inputs == "f32":
        return (x / np.sqrt(var + F32(eps))).astype(F32) * gain
    rounded = round_to(x * gain, gemm_inputs)
    if int8:
        rounded = q8_dequantized(rounded)
    return (rounded * (F32(1) / np.sqrt(var + F32(eps)))).astype(F32)


class Reference:
    """``Reference(config, checkpoint)``: checkpoint is anything with ``f32(name)`` (a :class:`Checkpoint`) or a
    mapping of internal tensor names to arrays. All weights are held as float32.

    ``gemm_inputs="bf16"`` (or ``"fp16"``) is the same model with every projection's input rounded to that type,
    where a tensor-core prefill (and HF's BF16 model) rounds it: the hidden state entering each projection as
    round(x * (1 + w)) * rsqrt(mean x^2 + eps) (the norm's row scale applied after the rounding, as the prefill
    GEMM epilogue does), the gated-norm and gated-attention outputs, the SwiGLU activation, and the KV cache entries.
    The default ``"f32"`` rounds nothing. ``kv_cache`` (a format of lucegen/model/kv_cache.py) stores the KV cache
    entries in that format instead (q8_0 / q4_0: quantised and back). ``int8_inputs``: the weights (internal names)
    whose inputs are also int8-rounded per 256 values (quant.q8_dequantized, with gemm_inputs "fp16"), as the quantised
    target's int8-activation GEMMs take them (QuantDecoder.int8_weights); weights sharing an input share the choice."""

    def __init__(self, config: ModelConfig, checkpoint, gemm_inputs: str = "f32", kv_cache: str | None = None,
                 int8_inputs=()):
        if gemm_inputs not in ("f32", "bf16", "fp16"):
            raise ValueError(f"gemm_inputs must be f32, bf16 or fp16, got {gemm_inputs!r}")
        self.int8_inputs = frozenset(int8_inputs)
        if self.int8_inputs and gemm_inputs != "fp16":
            raise ValueError(f"int8 inputs are rounded from fp16 values; gemm_inputs is {gemm_inputs!r}")
        self.gemm_inputs = gemm_inputs
        self.kv_format = None if kv_cache is None else kv_format(kv_cache)
        self.config = config
        source = _DictWeights(checkpoint) if isinstance(checkpoint, Mapping) else checkpoint
        self.w: dict[str, np.ndarray] = {}
        for name, shape in config.tensor_shapes().items():
            array = np.ascontiguousarray(source.f32(name), dtype=F32)
            if array.shape != shape:
                raise ValueError(f"{name}: shape {array.shape}, expected {shape}")
            self.w[name] = array
        self.lm_head = self.w["embed_tokens.weight"] if config.tie_word_embeddings else self.w["lm_head.weight"]
        self.inv_freq = rope_inv_freq(config)

    # -------------------------------------------------------------------------------------- state
    def new_state(self, max_len: int | None = None) -> ReferenceState:
        c = self.config
        cap = max_len or 64
        layers = []
        for kind in c.layer_types:
            if kind == FULL:
                layers.append(AttentionCache(np.zeros((c.num_kv_heads, cap, c.head_dim), F32),
                                             np.zeros((c.num_kv_heads, cap, c.head_dim), F32)))
            else:
                layers.append(DeltaNetState(
                    np.zeros((c.conv_dim, c.conv_kernel - 1), F32),
                    np.zeros((c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim), F32)))
        return ReferenceState(layers)

    def _round(self, x: np.ndarray, weight: str | None = None) -> np.ndarray:
        """x as the input of ``weight`` (or a cache entry: None)."""
        x = x if self.gemm_inputs == "f32" else round_to(x, self.gemm_inputs)
        return q8_dequantized(x) if weight in self.int8_inputs else x

    def _stored(self, kv_rows: np.ndarray) -> np.ndarray:
        """KV cache rows [..., head_dim] as the cache holds them."""
        return self._round(kv_rows) if self.kv_format is None else stored(self.kv_format, kv_rows)

    def _norm_in(self, x: np.ndarray, w: np.ndarray, weight: str) -> np.ndarray:
        """rms_norm_1p(x, w) as the input of ``weight`` (see the class docstring for the rounded variants)."""
        return norm_input(x, F32(1) + w, self.config.rms_norm_eps, self.gemm_inputs, weight in self.int8_inputs)

    # -------------------------------------------------------------------------------------- forward
    def forward(self, tokens, state: ReferenceState, hidden_layers=(), logits: str = "all"):
        """Run ``tokens`` (a prompt or one token) from ``state.position``; advances ``state`` in place.

        Returns logits [T, vocab] (``logits="last"``: [1, vocab]; ``"none"``: None). With ``hidden_layers``, returns
        ``(logits, {i: [T, hidden]})``: the residual stream after layer i (HF ``hidden_states[i + 1]``)."""
        c = self.config
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("forward: no tokens")
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError(f"forward: token id out of range [0, {c.vocab_size})")
        positions = np.arange(state.position, state.position + tokens.size)
        x = self.w["embed_tokens.weight"][tokens].astype(F32)
        hidden = {}
        for i, kind in enumerate(c.layer_types):
            p = f"layers.{i}."
            first = p + ("self_attn.q_proj.weight" if kind == FULL else "linear_attn.in_proj_qkv.weight")
            h = self._norm_in(x, self.w[p + "input_layernorm.weight"], first)
            if kind == FULL:
                x = x + self.gated_attention(i, h, positions, state.layers[i])
            else:
                x = x + self.gated_delta_net(i, h, state.layers[i])
            h = self._norm_in(x, self.w[p + "post_attention_layernorm.weight"], p + "mlp.gate_proj.weight")
            x = x + self.swiglu_mlp(i, h)
            if i in hidden_layers:
                hidden[i] = x.copy()
        state.position += tokens.size
        if logits == "none":
            out = None
        else:
            xs = x[-1:] if logits == "last" else x
            head = "embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
            out = self._norm_in(xs, self.w["norm.weight"], head) @ self.lm_head.T
        return (out, hidden) if hidden_layers else out

    def swiglu_mlp(self, i: int, x: np.ndarray) -> np.ndarray:
        """Qwen3_5MLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""
        p = f"layers.{i}.mlp."
        gate = x @ self.w[p + "gate_proj.weight"].T
        up = x @ self.w[p + "up_proj.weight"].T
        return self._round(silu(gate) * up, p + "down_proj.weight") @ self.w[p + "down_proj.weight"].T

    def gated_attention(self, i: int, x: np.ndarray, positions: np.ndarray, cache: AttentionCache) -> np.ndarray:
        """Qwen3_5Attention (eager): q_proj gives per head [query | gate]; q/k RMSNorm (1+w) per head; partial RoPE;
        causal softmax(q k^T * head_dim^-0.5) v with GQA; output * sigmoid(gate); o_proj."""
        c = self.config
        p = f"layers.{i}.self_attn."
        t, hd = x.shape[0], c.head_dim
        qg = (x @ self.w[p + "q_proj.weight"].T).reshape(t, c.num_attention_heads, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(t, -1)
        k = (x @ self.w[p + "k_proj.weight"].T).reshape(t, c.num_kv_heads, hd)
        v = (x @ self.w[p + "v_proj.weight"].T).reshape(t, c.num_kv_heads, hd)
        q = rms_norm_1p(q, self.w[p + "q_norm.weight"], c.rms_norm_eps)
        k = rms_norm_1p(k, self.w[p + "k_norm.weight"], c.rms_norm_eps)
        q = apply_rope(q, positions, self.inv_freq)
        k = apply_rope(k, positions, self.inv_freq)
        cache.append(self._stored(k.transpose(1, 0, 2)), self._stored(v.transpose(1, 0, 2)))

        keys, values = cache.k, cache.v  # [kv_heads, L, hd], key j sits at position j
        group = c.num_attention_heads // c.num_kv_heads
        qh = q.transpose(1, 0, 2).reshape(c.num_kv_heads, group * t, hd)  # q head = kv head * group + r
        scores = (qh @ keys.transpose(0, 2, 1)).reshape(c.num_kv_heads, group, t, -1) * F32(hd ** -0.5)
        causal = np.arange(keys.shape[1])[None, :] > positions[:, None]  # [t, L]
        scores = np.where(causal, -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = (scores / scores.sum(axis=-1, keepdims=True)).astype(F32)
        out = probs.reshape(c.num_kv_heads, group * t, -1) @ values  # [kv_heads, group*t, hd]
        out = out.reshape(c.num_attention_heads, t, hd).transpose(1, 0, 2).reshape(t, -1)
        return self._round(out * sigmoid(gate), p + "o_proj.weight") @ self.w[p + "o_proj.weight"].T

    def gated_delta_net(self, i: int, x: np.ndarray, st: DeltaNetState) -> np.ndarray:
        """Qwen3_5GatedDeltaNet: in_proj_qkv -> causal depthwise conv + SiLU -> split q, k, v -> l2norm(q), l2norm(k),
        q / sqrt(dk); beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias); key heads repeat_interleave to the
        value heads; gated delta rule; gated RMSNorm with z; out_proj."""
        c = self.config
        p = f"layers.{i}.linear_attn."
        t = x.shape[0]
        hk, hv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, \
            c.linear_value_head_dim
        mixed = x @ self.w[p + "in_proj_qkv.weight"].T  # [t, conv_dim]
        z = (x @ self.w[p + "in_proj_z.weight"].T).reshape(t, hv, dv)
        b = x @ self.w[p + "in_proj_b.weight"].T  # [t, hv]
        a = x @ self.w[p + "in_proj_a.weight"].T
        mixed, st.conv = causal_conv1d_silu(mixed, st.conv, self.w[p + "conv1d.weight"][:, 0, :])
        kd = c.linear_key_dim
        q = mixed[:, :kd].reshape(t, hk, dk)
        k = mixed[:, kd : 2 * kd].reshape(t, hk, dk)
        v = mixed[:, 2 * kd :].reshape(t, hv, dv)
        beta = sigmoid(b)
        g = (-np.exp(self.w[p + "A_log"]) * softplus(a + self.w[p + "dt_bias"])).astype(F32)
        if hv != hk:  # value head h reads key head h // (hv / hk)
            q = np.repeat(q, hv // hk, axis=1)
            k = np.repeat(k, hv // hk, axis=1)
        q = l2norm(q) * F32(1 / np.sqrt(dk))
        k = l2norm(k)
        o = gated_delta_rule(q, k, v, g, beta, st.recurrent)  # [t, hv, dv]
        o = gated_rms_norm(o, z, self.w[p + "norm.weight"], c.rms_norm_eps).reshape(t, -1)
        return self._round(o, p + "out_proj.weight") @ self.w[p + "out_proj.weight"].T

    # -------------------------------------------------------------------------------------- convenience
    def greedy(self, prompt, steps: int, state: ReferenceState | None = None) -> list[int]:
        """Prefill ``prompt`` then decode ``steps`` tokens greedily; returns the generated ids."""
        state = state or self.new_state(len(prompt) + steps)
        logits = self.forward(prompt, state, logits="last")
        out = []
        for _ in range(steps):
            nxt = int(np.argmax(logits[-1]))
            out.append(nxt)
            logits = self.forward([nxt], state)
        return out
