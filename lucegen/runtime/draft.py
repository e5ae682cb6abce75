"""The DFlash draft network on the device: context ingest, one block forward, top-K, as a drafter for SpecDecoder.

    dec = MegakernelDecoder(target_dir, max_context=4096)
    draft = DFlashDrafter(dec, draft_dir, k=4)            # loads the draft next to the target's weights
    pre = Prefiller(dec, draft=draft)                     # the prompt's tapped hidden states become draft context
    ver = TreeVerifier(dec, budget=22, draft=draft)       # every verify slot's tapped hidden states are captured
    spec = SpecDecoder(ver, draft)                        # after each commit the accepted slots join the context

The math is :class:`lucegen.model.dflash_reference.DraftReference` (z-lab/dflash's ``DFlashDraftModel``). On the
device, per block of ``block_size`` rows at positions start .. (start = the root's position):

    x = embed[root, mask, ...]                                      the target's embedding (its own gather)
    per draft layer:  proj = gemm_rows_f32(xn, [q|k|v]) * r;  draft_block_prepare;  draft_attention
                      x += gemm(attn, o);  act = gemm_swiglu(xn, gateup) * r;  x += gemm(act, down)
    logits = target lm_head(xn[1:]) * r;  draft_topk_partial / _merge             -> [block_size - 1, k]

and per committed batch of rows (the prompt, or a verify pass's accepted path):

    draft_capture after each tapped target layer (inside the prefill / verify pass)
    ctx = gemm_residual(capture, fc) with x = 0: xn = fc(features) * (1 + hidden_norm'), its ss
    per draft layer: ctx_kv = gemm_rows_f32(xn, [k|v] rows of that layer's qkv) * r;  draft_context_store

The projections are the prefill GEMMs of the target's shape (the draft's hidden size is the target's; so are its
RMSNorm eps, checked at load), or, for a draft whose matrices are all Q8_0 (a GGUF), the quantised GEMM on its
blocks (:mod:`lucegen.runtime.draft_weights`). The embedding and the lm_head are the target's, through its
``layer_weights`` (:class:`lucegen.runtime.prefill.runner.LayerWeights`): compute-dtype rows for a BF16 target, GGML
blocks (the ``embed_<type>`` gather, the quantised GEMM) for a :class:`lucegen.runtime.quant_target.QuantDecoder`.
Draft norm weights are packed zero-centred (w - 1, exact in f32) so that every norm is the target's x * r * (1 + w).
The context lives in a ring of ``ring`` rows per layer (default: the decoder's context, which never wraps); a
smaller ring bounds what the draft attends to, to the last ``ring`` positions.
"""

from __future__ import annotations

import numpy as np

from .. import codegen
from ..errors import CheckpointError, LucegenError
from ..families.dflash_draft import TOPK_MAX
from ..families.prefill import prefill_params
from ..model.checkpoint import load_dflash, target_facts
from ..model.dflash import DFlashConfig
from ..model.dflash_reference import draft_inv_freq
from .device import Buffer, address
from .draft_weights import draft_weights
from .packing import checked_shape

THREADS = 256  # templates/dflash/draft.cu.j2: DR_NT, DR_TK_NT
ATTENTION_WARPS = 4  # DR_AT_WARPS
TOPK_CHUNK = 8192  # logits per block of draft_topk_partial (at most THREADS // TOPK_MAX chunks per row)


class DraftLayout:
    """Where each draft vector sits in ``wvec`` (float offsets): ("in_norm", l), ("post_norm", l), "hidden_norm",
    "final_norm", "q_norm" / "k_norm" as [L][head_dim] blocks, "inv_freq". The matrices are a
    :mod:`lucegen.runtime.draft_weights` set's."""

    def __init__(self, config: DFlashConfig):
        c = config
        H = c.hidden_size
        self.vec: dict = {}
        self.wvec_floats = 0

        def take_vec(key, n):
            self.vec[key] = self.wvec_floats
            self.wvec_floats += -(-n // 4) * 4  # 16-byte aligned

        take_vec("hidden_norm", H)
        for l in range(c.num_layers):
            take_vec(("in_norm", l), H)
            take_vec(("post_norm", l), H)
        take_vec("final_norm", H)
        take_vec("q_norm", c.num_layers * c.head_dim)
        take_vec("k_norm", c.num_layers * c.head_dim)
        take_vec("inv_freq", c.head_dim // 2)


def draft_vectors(layout: DraftLayout, checkpoint):
    """Yield (offset, float32 array) filling every draft vector of ``wvec``."""
    c = checkpoint.config
    shapes = c.tensor_shapes()

    def norm(name):  # zero-centred: the kernels apply (1 + w)
        w = checked_shape(checkpoint, name, shapes[name], np.ascontiguousarray(checkpoint.f32(name), np.float32))
        return (w - np.float32(1)).astype(np.float32)

    for l in range(c.num_layers):
        p = f"layers.{l}."
        yield layout.vec[("in_norm", l)], norm(p + "input_layernorm.weight")
        yield layout.vec[("post_norm", l)], norm(p + "post_attention_layernorm.weight")
    yield layout.vec["hidden_norm"], norm("hidden_norm.weight")
    yield layout.vec["final_norm"], norm("norm.weight")
    yield layout.vec["q_norm"], np.concatenate(
        [norm(f"layers.{l}.self_attn.q_norm.weight") for l in range(c.num_layers)])
    yield layout.vec["k_norm"], np.concatenate(
        [norm(f"layers.{l}.self_attn.k_norm.weight") for l in range(c.num_layers)])
    yield layout.vec["inv_freq"], draft_inv_freq(c)


def check_pair(config: DFlashConfig, target_config, source) -> None:
    """What the shared kernels need of a (draft, target) pair beyond :meth:`DFlashConfig.check_target`."""
    config.check_target(target_config, source=source)
    if config.rms_norm_eps != target_config.rms_norm_eps:
        raise CheckpointError(f"{source}: rms_norm_eps {config.rms_norm_eps} differs from the target's "
                              f"{target_config.rms_norm_eps} (the draft's GEMM epilogues are the target's)")
    if config.input_embedding_scale != 1.0:
        raise CheckpointError(f"{source}: dflash_config.input_embedding_scale {config.input_embedding_scale} is "
                              "not supported (only 1.0)")


class DFlashDrafter:
    """A DFlash draft next to a target decoder (a :class:`MegakernelDecoder` or a :class:`QuantDecoder`: one with
    ``layer_params`` and ``layer_weights``). ``k`` candidates per drafted position (at most TOPK_MAX); ``ring``
    context rows per layer (default, and at most: the decoder's max_context); ``rows`` target rows one capture holds (a
    prefill segment or a verify pass; default 512)."""

    def __init__(self, decoder, draft, *, k: int = 8, ring: int | None = None, rows: int = 512,
                 graphs: bool = True):
        from ..model.checkpoint import Checkpoint

        self.dec = decoder
        self.device, self.target = decoder.device, decoder.target
        self.checkpoint = (draft if isinstance(draft, Checkpoint)
                           else load_dflash(draft, target=target_facts(decoder.checkpoint)))
        self.config = cfg = self.checkpoint.config
        if not isinstance(cfg, DFlashConfig):
            raise CheckpointError(f"{self.checkpoint.path}: not a DFlash draft")
        check_pair(cfg, decoder.config, self.checkpoint.path)
        for name, value, lo, hi in (("k", k, 1, TOPK_MAX), ("rows", rows, 1, 1 << 20),
                                    ("ring", decoder.max_context if ring is None else ring, 1, None)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi and value > hi):
                raise LucegenError(f"draft {name} must be an integer in [{lo}, {hi or 'any'}], got {value!r}")
        self.k, self.rows = k, rows
        # a ring bounds the context the draft sees: one as long as the decoder's context holds all of it
        self.ring = decoder.max_context if ring is None else min(ring, decoder.max_context)
        self.ring_follows_context = ring is None  # spans whatever context the decoder is built for
        self.depth = cfg.block_size - 1  # drafted positions per block
        self.taps = {layer: i for i, layer in enumerate(cfg.target_layer_ids)}
        dev, t = self.device, self.target
        self.pf = prefill_params(decoder.config, t)
        compiled = codegen.build(t, "dflash_draft", cfg)  # the loaded draft's shape (one the kernels can run)
        self.weights = draft_weights(dev, t, self.pf, self.checkpoint, rows)  # dense, or Q8_0 blocks kept
        self.gemm = self.weights.gemm
        self.head = decoder.layer_weights(decoder.layer_params())  # the target's embedding and lm_head
        module = dev.load(compiled)
        self.capture_fn, self.store_fn = module.function("draft_capture"), module.function("draft_context_store")
        self.prepare_fn, self.attend_fn = module.function("draft_block_prepare"), module.function("draft_attention")
        self.topk_partial_fn, self.topk_merge_fn = module.function("draft_topk_partial"), \
            module.function("draft_topk_merge")
        self.topk_chunks = min(THREADS // TOPK_MAX, -(-cfg.vocab_size // TOPK_CHUNK))
        self.layout = DraftLayout(cfg)
        self.stream = dev.stream()
        self.use_graphs = graphs
        self._graphs: dict = {}
        self._allocate()
        self._upload_weights()
        self.position = 0  # committed positions in the context

    # ------------------------------------------------------------------------------------------ memory
    def _allocate(self) -> None:
        c, d, R, B = self.config, self.device, self.rows, self.config.block_size
        H, L, ss_rows = c.hidden_size, c.num_layers, self.weights.ss_scratch  # the parts a residual writes
        block_ss_parts = max(ss_rows, self.head.embed_ss_scratch)  # the block's ss: the target's embedding first
        self.wvec = d.alloc(4 * self.layout.wvec_floats)
        self.capture = d.alloc(2 * R * c.fc_in_features)
        self.ctx_x, self.ctx_xn, self.ctx_ss = d.alloc(4 * R * H), d.alloc(2 * R * H), d.alloc(4 * ss_rows * R)
        self.ctx_kv = d.alloc(4 * R * L * 2 * c.kv_dim)
        self.cache = d.alloc(self.ring_bytes_per_token() * self.ring)
        self.x, self.xn, self.ss = d.alloc(4 * B * H), d.alloc(2 * B * H), d.alloc(4 * block_ss_parts * B)
        self.proj = d.alloc(4 * B * (c.q_dim + 2 * c.kv_dim))
        self.q_ws, self.block_kv = d.alloc(2 * B * c.q_dim), d.alloc(2 * 2 * B * c.kv_dim)
        self.attn, self.act = d.alloc(2 * B * c.q_dim), d.alloc(2 * B * c.intermediate_size)
        self.logits = d.alloc(4 * (B - 1) * c.vocab_size)
        self.lp, self.tok = d.alloc(4 * (B - 1) * self.k), d.alloc(4 * (B - 1) * self.k)
        self.topk_ws = d.alloc(8 * (B - 1) * self.topk_chunks * (TOPK_MAX + 1))  # candidates, then (max, sum)
        self.block_in = d.alloc(4 * (B + 1))  # tokens [B], start
        self.commit_in = d.alloc(4 * (2 + R))  # pos0, n, rows [n]
        d.memset(self.wvec)

    def _upload_weights(self) -> None:
        self.weight_bytes = self.weights.weight_bytes
        for offset, array in draft_vectors(self.layout, self.checkpoint):
            self.device.upload(np.ascontiguousarray(array), Buffer(self.wvec.ptr + 4 * offset, array.nbytes, None))
            self.weight_bytes += array.nbytes

    BUFFERS = ("wvec", "capture", "ctx_x", "ctx_xn", "ctx_ss", "ctx_kv", "cache", "x", "xn", "ss", "proj",
               "q_ws", "block_kv", "attn", "act", "logits", "lp", "tok", "topk_ws", "block_in",
               "commit_in")

    def close(self) -> None:
        for g in self._graphs.values():
            g.destroy()
        self._graphs.clear()
        for name in self.BUFFERS:
            b = getattr(self, name, None)
            if isinstance(b, Buffer):
                b.free()
        if getattr(self, "weights", None) is not None:
            self.weights.free()
            self.weights = None

    def ring_bytes_per_token(self) -> int:
        """Device bytes of one ring position: k and v of every draft layer (the compute dtype)."""
        return 2 * self.config.num_layers * 2 * self.config.kv_dim

    def reset(self) -> None:
        """Forget the context (the decoder was reset)."""
        self.position = 0

    def _split_k(self) -> dict:
        """The dense GEMMs' split-K workspace keywords (residual and rows_f32: a few rows fill the chip only so)."""
        return self.weights.split_k

    def _mat(self, key):
        return self.weights.matrix(key)

    def _vec(self, key) -> int:
        return self.wvec.ptr + 4 * self.layout.vec[key]

    # ------------------------------------------------------------------------------------------ context
    def capture_hook(self, stream):
        """``after_layer(i, T, x)`` for the target's layer loop: after a tapped layer, its T residual rows go into
        that tap's columns of the capture."""
        def after_layer(i: int, T: int, x: int) -> None:
            tap = self.taps.get(i)
            if tap is not None:
                if T > self.rows:
                    raise LucegenError(f"draft capture: {T} rows exceed the drafter's {self.rows}")
                self.capture_fn.launch(T, THREADS, stream=stream, x=address(x), capture=self.capture, tap=tap)
        return after_layer

    def enqueue_ingest(self, T: int, stream, *, pos0: int = 0, from_commit: bool = False) -> None:
        """Queue the context update from the T captured rows: fc + hidden_norm, every layer's K/V, stored at
        positions pos0 + i. ``from_commit``: rows, count and pos0 come from ``commit_in`` (a verify's accepted path,
        row i = slot path[i]); else row i is capture row i."""
        c, R = self.config, self.rows
        H, L, kvd = c.hidden_size, c.num_layers, c.kv_dim
        self.device.memset_async(self.ctx_x.ptr, 4 * T * H, stream)
        self.gemm.residual(self.capture.ptr, c.fc_in_features, self._mat("fc"), c.fc_in_features, T, H,
                           c.fc_in_features, self.ctx_x.ptr, H, self._vec("hidden_norm"), self.ctx_xn.ptr, H,
                           self.ctx_ss.ptr, R, stream=stream, **self._split_k())
        ctx_ss = self.gemm.ss_for_readers(self.ctx_ss.ptr, self.weights.ss_parts, R, T)
        for l in range(L):
            self.gemm.rows_f32(self.ctx_xn.ptr, H, self._mat(("kv", l)), H, T, 2 * kvd, H, *ctx_ss, R,
                               self.ctx_kv.ptr + 4 * l * 2 * kvd, L * 2 * kvd, stream=stream, **self._split_k())
        ci = self.commit_in.ptr
        rows = (dict(rows=address(ci + 8), n=T, n_at=address(ci + 4), pos0=0, pos0_at=address(ci)) if from_commit
                else dict(rows=address(0), n=T, n_at=address(0), pos0=pos0, pos0_at=address(0)))
        self.store_fn.launch((T, L), THREADS, stream=stream, ctx_kv=self.ctx_kv, **rows,
                             k_norm=address(self._vec("k_norm")), inv_freq=address(self._vec("inv_freq")),
                             cache=self.cache, ring=self.ring)

    def committed(self, path, pos0: int, slots: int) -> None:
        """After a verify pass of ``slots`` slots committed ``path`` (slot indices, root first) at positions pos0 ..:
        those slots' captured rows join the context."""
        path = np.asarray(path, np.int32).reshape(-1)
        if pos0 != self.position:
            raise LucegenError(f"draft context holds {self.position} positions, the commit starts at {pos0}")
        if not 1 <= path.size <= slots <= self.rows or path.min() < 0 or path.max() >= slots:
            raise LucegenError(f"draft commit: path {path.tolist()} of a {slots}-slot pass does not fit")
        self.device.upload_async(np.concatenate([[pos0, path.size], path]).astype(np.int32), self.commit_in,
                                 self.stream)
        self._run(("commit", slots), lambda: self.enqueue_ingest(slots, self.stream, from_commit=True))
        self.stream.synchronize()
        self.position += int(path.size)

    def prefilled(self, n: int) -> None:
        """The prefill queued the context update of ``n`` prompt positions (see ``Prefiller(draft=...)``)."""
        self.position += int(n)

    # ------------------------------------------------------------------------------------------ one block
    def _enqueue_block(self) -> None:
        c, st = self.config, self.stream
        H, I, B, L = c.hidden_size, c.intermediate_size, c.block_size, c.num_layers
        nqkv = c.q_dim + 2 * c.kv_dim
        # the partial sums the block's readers take: of the target's embedding (its GEMM's rule) before layer 0, of
        # this draft's residuals after
        embed_ss = self.head.gemm.ss_for_readers(self.ss.ptr, self.head.embed_ss_parts, B, B)
        ss, ss_parts = self.gemm.ss_for_readers(self.ss.ptr, self.weights.ss_parts, B, B)
        tokens, start = self.block_in.ptr, self.block_in.ptr + 4 * B
        self.head.embed(tokens, B, self.x.ptr, self.xn.ptr, self.ss.ptr, B, st, norm=self._vec(("in_norm", 0)))
        for l in range(L):
            next_norm = self._vec(("in_norm", l + 1)) if l + 1 < L else self._vec("final_norm")
            in_ss, in_parts = embed_ss if l == 0 else (ss, ss_parts)
            self.gemm.rows_f32(self.xn.ptr, H, self._mat(("qkv", l)), H, B, nqkv, H, in_ss, in_parts, B,
                               self.proj.ptr, nqkv, stream=st, **self._split_k())
            self.prepare_fn.launch(B, THREADS, stream=st, proj=self.proj,
                                   q_norm=address(self._vec("q_norm") + 4 * l * c.head_dim),
                                   k_norm=address(self._vec("k_norm") + 4 * l * c.head_dim),
                                   inv_freq=address(self._vec("inv_freq")), start_at=address(start), q_ws=self.q_ws,
                                   block_kv=self.block_kv)
            layer_cache = self.cache.ptr + 2 * l * 2 * c.kv_dim * self.ring
            self.attend_fn.launch((B, c.num_attention_heads), ATTENTION_WARPS * self.target.warp_size, stream=st,
                                  q_ws=self.q_ws, cache=address(layer_cache), ring=self.ring, block_kv=self.block_kv,
                                  start_at=address(start), causal=int(c.layer_is_causal(l)),
                                  window=c.layer_window(l) or 0, out=self.attn)
            self.gemm.residual(self.attn.ptr, c.q_dim, self._mat(("o", l)), c.q_dim, B, H, c.q_dim, self.x.ptr, H,
                               self._vec(("post_norm", l)), self.xn.ptr, H, self.ss.ptr, B, stream=st,
                               **self._split_k())
            self.gemm.swiglu(self.xn.ptr, H, self._mat(("gateup", l)), H, B, 2 * I, H, ss, ss_parts, B,
                             self.act.ptr, I, stream=st)
            self.gemm.residual(self.act.ptr, I, self._mat(("down", l)), I, B, H, I, self.x.ptr, H, next_norm,
                               self.xn.ptr, H, self.ss.ptr, B, stream=st, **self._split_k())
        rows = B - 1  # the drafted positions: block rows 1 ..
        self.head.lm_head(self.xn.ptr + 2 * H, rows, ss + 4, ss_parts, B, self.logits.ptr, st)
        chunks = self.topk_chunks
        cand, part = self.topk_ws.ptr, self.topk_ws.ptr + 8 * rows * chunks * TOPK_MAX
        self.topk_partial_fn.launch((rows, chunks), THREADS, stream=st, logits=self.logits, n_cols=c.vocab_size,
                                    multiplier=c.output_multiplier, softcap=c.final_logit_softcapping or 0.0,
                                    chunk_cols=-(-c.vocab_size // chunks), cand=address(cand), part=address(part))
        self.topk_merge_fn.launch(rows, THREADS, stream=st, cand=address(cand), part=address(part), chunks=chunks,
                                  k=self.k, lp_out=self.lp, tok_out=self.tok)

    def _run(self, key, enqueue) -> None:
        if not self.use_graphs:
            enqueue()
            return
        graph = self._graphs.get(key)
        if graph is None:
            self.stream.begin_capture()
            try:
                enqueue()
            finally:
                graph = self.stream.end_capture()
            self._graphs[key] = graph
        graph.launch(self.stream)

    def propose(self, history) -> tuple[np.ndarray, np.ndarray]:
        """The drafter protocol (lucegen/runtime/dflash.py): top-k rows (log-probabilities [block_size - 1, k]
        descending, token ids) for the positions after the root ``history[-1]``, which sits at the decoder's
        position (the context must hold every position before it)."""
        c, dec = self.config, self.dec
        if self.position != dec.position:
            raise LucegenError(f"draft context holds {self.position} positions but the target has committed "
                               f"{dec.position}: prefill and commit through this drafter")
        root = int(history[-1])
        if not 0 <= root < c.vocab_size:
            raise LucegenError(f"draft root token {root} out of range [0, {c.vocab_size})")
        block = np.full(c.block_size + 1, c.mask_token_id, np.int32)
        block[0], block[-1] = root, dec.position
        self.device.upload_async(block, self.block_in, self.stream)  # after a queued block that may still read it
        self._run("block", self._enqueue_block)
        self.stream.synchronize()
        rows = c.block_size - 1
        lp = self.device.download(self.lp, np.float32, (rows, self.k)).astype(np.float64)
        tok = self.device.download(self.tok, np.int32, (rows, self.k)).astype(np.int64)
        return lp, tok
