"""DDTree verify on the device: the target over a whole token tree in one pass, then the commit of the accepted path.

    dec = MegakernelDecoder(model_dir, max_context=4096)
    root = Prefiller(dec).prefill(prompt_ids)        # the greedy next token: the first step's root
    ver = TreeVerifier(dec, budget=22)
    argmax = ver.verify(tree, root)                  # int [1 + n]: the target's greedy token after every slot
    nodes, bonus = ddtree.accept(tree, argmax)
    ver.commit(tree, nodes, bonus)                   # the state holds root + accepted nodes; dec.position advances

The pass is the prefill's layer loop (:func:`lucegen.runtime.prefill.runner.enqueue_layers`: the same GEMMs) with
the token mixing of ``templates/dflash/tree_verify.cu.j2``: the conv window and DeltaNet state of every slot derive
from its parent's, attention sees the committed context plus the slot's ancestors. Every slot's conv window and
DeltaNet state *update* (g, k, delta: each layer's workspace) are kept, not its state, so the commit replays the
accepted path's updates over the live state with the pass's own operations (the same bits), copies the accepted
slot's conv window and moves the accepted path's KV rows into sequence order. Until ``commit`` the decoder's state
is only read (the pass writes its slots' KV rows past the committed position, which no sequence position refers
to): a rejected tree leaves no trace.

Lossless by construction, bit for bit: every kernel computes a slot from its own path in a fixed order, and the
GEMMs run one fixed tiling whatever the row count (no GEMV path for few rows, no split-K), so a slot's logits do
not depend on the rest of the tree. Greedy decoding through one-slot trees (:meth:`TreeVerifier.greedy`) is
therefore exactly what any speculative run through the same verifier must emit.
"""

from __future__ import annotations

import numpy as np

from .. import codegen
from ..errors import LucegenError
from ..model.sampling import SamplingParams, sample
from ..families.tree_verify import RULE_COLUMNS_PER_WARP, THREADS, gated_norm_quantises, verify_params
from . import ddtree
from .device import Buffer, address
from .device_sampling import checked_sampling, fused
from .prefill.attention import AttentionKernels, query_workspace_bytes
from .prefill.runner import Activations, MixWrote, conv_layer, enqueue_layers, kv_layer, recurrent_layer, wvec_at
from .tree_attention import TreeAttention, partial_bytes


def load_module(device, target, pf: dict):
    """The tree verify kernels for the model of ``pf``, compiled for ``target`` and loaded on ``device``."""
    return device.load(codegen.build(target, "tree_verify", params=verify_params(pf, target)))


#: rows_argmax's blocks per logits row, at most: a cap that sizes every slot's partial results (the count itself
#: follows the chip's compute units: :meth:`TreeVerifier._argmax_slices`).
ARGMAX_MAX_SLICES = 512


def slot_buffer_bytes(decoder, pf: dict) -> dict[str, int]:
    """Bytes per verify slot of each of :class:`TreeVerifier`'s slot-sized buffers (besides its
    :class:`Activations` rows and the tree layout, whose path table grows with the square of the slots): every
    DeltaNet layer's token-mix workspace (which keeps the slot's state update for the commit) and conv window, the
    attention's roped queries and its key ranges' partial softmax sums and counters, the slot's path entry, logits
    row and argmax, and rows_argmax's partial results and counter. (Its token is in the step inputs:
    :func:`step_input_words`.)"""
    c, lay = decoder.config, decoder.layout
    return {"ws": 4 * max(1, lay.n_dn) * ws_floats(pf),
            "windows": 4 * max(1, lay.n_dn) * lay.conv_window_floats,
            "q_ws": query_workspace_bytes(pf, 1),
            "path": 4, "logits": 4 * c.vocab_size, "argmax": 4,
            "argmax_v": 4 * ARGMAX_MAX_SLICES, "argmax_i": 4 * ARGMAX_MAX_SLICES, "argmax_arrived": 4,
            "att_partial": partial_bytes(pf, decoder.target),  # any context
            "att_arrived": 4 * c.num_attention_heads}


def ws_floats(pf: dict) -> int:
    """Floats per slot of one DeltaNet layer's workspace (tree_verify.cu.j2's tree_ws): q, k, v, g, beta, o, delta."""
    return 2 * pf["KD"] + 3 * pf["VD"] + 2 * pf["NV"]


def step_input_words(slots: int) -> int:
    """int32 words of what a pass of up to ``slots`` slots reads from the host, kept in one buffer so that one
    upload sets them: pos0, the slots' tokens, then the tree layout (:func:`tree_layout`, 2 S + S^2 words)."""
    return 1 + slots + (2 + slots) * slots


def write_step_inputs(out: np.ndarray, position: int, tokens: np.ndarray, layout: np.ndarray, slots: int) -> None:
    """The step inputs of a pass at ``position`` into the int32 array ``out`` (at least 1 + slots + layout.size):
    pos0, ``tokens`` (its slots', padded with zeros to ``slots``), ``layout``."""
    out[0] = position
    out[1 : 1 + tokens.size] = tokens
    out[1 + tokens.size : 1 + slots] = 0
    out[1 + slots : 1 + slots + layout.size] = layout


def step_inputs(position: int, tokens: np.ndarray, layout: np.ndarray, slots: int) -> np.ndarray:
    """:func:`write_step_inputs` into a new array of exactly that length."""
    out = np.empty(1 + slots + layout.size, np.int32)
    write_step_inputs(out, position, tokens, layout, slots)
    return out


def tree_layout(tree: ddtree.Tree) -> np.ndarray:
    """The per-slot arrays the kernels read, as one int32 upload for S = 1 + n slots: parent [S] (-1 for the root),
    depth [S] (root 0), then the path table anc [S][S] (anc[s][d] = the slot at depth d on the way to s)."""
    parents = tree.verify_parents()
    S = parents.shape[0]
    depth = np.concatenate([[0], tree.depth]).astype(np.int32)
    anc = np.zeros((S, S), np.int32)
    for s in range(1, S):  # parents precede children: the parent's row is complete
        anc[s, : depth[s]] = anc[parents[s], : depth[s]]
        anc[s, depth[s]] = s
    return np.concatenate([parents.astype(np.int32), depth, anc.reshape(-1)])


class TreeVerifier:
    """Verify passes of up to ``1 + budget`` slots into a :class:`MegakernelDecoder`'s weights and state (the
    descriptor's ``[ddtree] budget`` by default). With a ``draft`` (a DFlashDrafter) every pass also captures each
    slot's hidden states after the draft's tapped layers, for :meth:`DFlashDrafter.committed`. A slot of
    ``tensor_core_keys`` keys or more attends on tensor cores (lucegen/runtime/tree_attention.py; None: the
    descriptor's ``[ddtree] tensor_core_attention_keys``)."""

    token_buffers = 1  # int32 arrays of max_context entries it holds: the greedy history

    def __init__(self, decoder, *, budget: int | None = None, graphs: bool = True, draft=None,
                 tensor_core_keys: int | None = None):
        self.dec, self.draft = decoder, draft
        self.device, self.target, self.config = decoder.device, decoder.target, decoder.config
        budget = self.target.ddtree.budget if budget is None else budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise LucegenError(f"tree budget must be a non-negative integer, got {budget!r}")
        self.budget, self.slots = budget, budget + 1
        if draft is not None and draft.rows < self.slots:
            raise LucegenError(f"the draft captures {draft.rows} rows per pass, fewer than {self.slots} verify slots")
        self.pf = decoder.layer_params()
        dev, t, pf, c = self.device, self.target, self.pf, self.config
        if c.linear_key_head_dim % t.warp_size or c.head_dim % t.warp_size:
            raise LucegenError(f"model {c.name}: tree verify needs the DeltaNet key head dim "
                               f"({c.linear_key_head_dim}) and head_dim ({c.head_dim}) to be multiples of the warp "
                               f"size {t.warp_size}")
        # One tiling for every row count: a slot's numbers must not depend on how many slots the tree has.
        self.weights = decoder.layer_weights(pf, batch_invariant=True)
        self.gemm = self.weights.gemm
        self.attention = AttentionKernels(dev, t, pf)
        self.module = load_module(dev, t, pf)
        fn = self.module.function
        # tree_delta_rule's threads and value columns a block
        self.rule_threads = t.tuning.tree_verify.rule_threads
        self.rule_columns = self.rule_threads // t.warp_size * RULE_COLUMNS_PER_WARP

        def waits_first(name):  # a kernel that begins with lg_dependent_start: launched programmatically
            return fn(name, programmatic=True)

        self.conv_fn, self.rule_fn = waits_first("tree_conv_prepare"), waits_first("tree_delta_rule")
        self.norm_fn = waits_first("tree_gated_norm")
        # a quantised target's: the gated norm's values as the out-projection's int8 activations (tree_gated_norm_q8)
        self.norm_q8_fn = waits_first("tree_gated_norm_q8") if gated_norm_quantises(pf, t) else None
        #: Whether the DeltaNet mixers write the out-projection's int8 activations themselves where its launch is
        #: prequantised (the same bytes as its own quantiser's: one launch fewer a layer); tests turn it off to
        #: compare, before the passes they compare are captured.
        self.mixers_quantise = True
        self.step_fn = waits_first("deltanet_decode_step")
        self.tree_attention = TreeAttention(self.module, t, pf, self.slots, decoder.max_context, tensor_core_keys)
        self.argmax_fn = waits_first("rows_argmax")
        self.commit_dn_fn, self.commit_kv_fn = fn("tree_commit_deltanet"), fn("tree_commit_kv")
        self.advance_fn = fn("tree_greedy_advance")
        self.sample_module = self.sample_fn = None  # rows_sample, loaded on the first sampled decode (_sampler)
        stage = self.rule_stage_bytes(self.slots)
        if stage > t.smem_per_block_optin:
            raise LucegenError(f"tree budget {budget}: the delta rule stages {stage} bytes of {self.slots} slots in "
                               f"shared memory, over {t.name}'s smem_per_block_optin {t.smem_per_block_optin}")
        if stage > t.smem_per_block:
            self.rule_fn.set_max_dynamic_smem(stage)
        self.stream = dev.stream()
        self.use_graphs = graphs
        # (slots, attention bodies) -> the captured pass (pos0 and the tree come from memory)
        self._graphs: dict[tuple, object] = {}
        self._decode_graphs: dict[tuple, object] = {}  # attention bodies -> one greedy step (see decode)
        self._verified: int | None = None  # slots of the last verify not yet committed (its updates are in self.ws)
        self._allocate()

    # ------------------------------------------------------------------------------------------ memory
    def _allocate(self) -> None:
        c, pf, S, d = self.config, self.pf, self.slots, self.device
        self.acts = Activations(d, c, pf, S)
        for name, size in slot_buffer_bytes(self.dec, pf).items():
            setattr(self, name, d.alloc(S * size))
        self.step_in = d.alloc(4 * step_input_words(S))  # pos0, tokens [S], then parent, depth, the path table
        self.pos0 = Buffer(self.step_in.ptr, 4, None)
        self.tokens = Buffer(self.step_in.ptr + 4, 4 * S, None)
        self.layout_buf = Buffer(self.step_in.ptr + 4 * (1 + S), 4 * (2 + S) * S, None)
        # a verify's step inputs and greedy tokens in page-locked memory, copied by its graph (no copy calls of the
        # host's on the step's way: they cost more than the copies)
        self.step_in_host = d.pinned(step_input_words(S), np.int32)
        self.argmax_host = d.pinned(S, np.int32)
        self.history = d.alloc(4 * self.token_buffers * self.dec.max_context)
        d.memset(self.argmax_arrived)  # rows_argmax's counters start at zero and end every launch there
        d.memset(self.att_arrived)  # so do tree_attention's
        self.dn_arrived = d.alloc(4 * self.config.linear_num_key_heads)  # and deltanet_decode_step's, a key head each
        d.memset(self.dn_arrived)

    def close(self) -> None:
        for g in [*getattr(self, "_graphs", {}).values(), *getattr(self, "_decode_graphs", {}).values()]:
            g.destroy()
        if getattr(self, "sample_module", None) is not None:
            self.sample_module.unload()
            self.sample_module = self.sample_fn = None
        if hasattr(self, "acts"):
            self.acts.free()
        for name in ("step_in_host", "argmax_host"):
            if getattr(self, name, None) is not None:
                getattr(self, name).free()
        names = (*slot_buffer_bytes(self.dec, self.pf), "step_in", "history", "dn_arrived") \
            if hasattr(self, "pf") else ()
        for name in names:  # what _allocate made
            b = getattr(self, name, None)
            if isinstance(b, Buffer):
                b.free()

    # ------------------------------------------------------------------------------------------ one pass
    def _mix(self, S: int, bodies: tuple[bool, bool], in_place: bool = False):
        """The layer mixers of an S-slot pass, its attention in ``bodies`` (TreeAttention.bodies at the pass's
        position). ``in_place`` (one slot, always committed: a greedy decode step) runs each DeltaNet mixer as one
        deltanet_decode_step launch, which writes the slot's state and conv window over the live ones (the three tree
        kernels' operations, so the same bits), and no commit follows."""
        dec, st, pf, acts, lay = self.dec, self.stream, self.pf, self.acts, self.dec.layout
        if in_place and S != 1:
            raise LucegenError(f"an in-place pass has one slot, got {S}")
        wvec = lambda off: wvec_at(dec, off)  # noqa: E731
        parent = self.layout_buf.ptr
        depth, anc = parent + 4 * S, parent + 8 * S

        def mix(l, T, amax=0, int8=None):  # amax: the output's magnitudes per 16 values, written beside it
            if l.kind == 0 and in_place:  # the whole mixer in one launch, over the live state and window
                self.step_fn.launch(pf["NV"], 2 * THREADS, stream=st,
                                    proj=acts.proj, conv_w=address(wvec(l.conv_w)),
                                    window=address(conv_layer(dec, l)), a_log=address(wvec(l.a_log)),
                                    dt_bias=address(wvec(l.dt_bias)), gnorm_w=address(wvec(l.gnorm)),
                                    state=address(recurrent_layer(dec, l)), out=acts.mix, amax_out=address(amax),
                                    arrived=self.dn_arrived)
            elif l.kind == 0:
                ws = self._layer_ws(l)
                windows = self.windows.ptr + 4 * l.slot * self.slots * lay.conv_window_floats
                conv_groups = 2 * pf["NK"] + -(-pf["VD"] // THREADS)  # q/k heads, then value chunks
                self.conv_fn.launch((S, conv_groups), THREADS, stream=st,
                                    proj=acts.proj, conv_w=address(wvec(l.conv_w)),
                                    conv_state=address(conv_layer(dec, l)), a_log=address(wvec(l.a_log)),
                                    dt_bias=address(wvec(l.dt_bias)), parent=address(parent), workspace=address(ws),
                                    windows=address(windows), n_slots=S)
                self.rule_fn.launch(self._rule_blocks(), self.rule_threads, smem=self.rule_stage_bytes(S), stream=st,
                                    workspace=address(ws), parent=address(parent), depth=address(depth),
                                    anc=address(anc), committed=address(recurrent_layer(dec, l)), n_slots=S)
                heads = -(-pf["NV"] // self._warps_per_block())  # blocks of a slot: a warp per value head
                if int8 is not None and self.norm_q8_fn is not None and self.mixers_quantise:
                    self.norm_q8_fn.launch((-(-S // int8.group) * int8.group, heads), THREADS,  # the group's rows
                                           stream=st, proj=acts.proj, gnorm_w=address(wvec(l.gnorm)),
                                           workspace=address(ws), n_slots=S, aq=address(int8.aq),
                                           a_da=address(int8.da), group=int8.group)
                    return MixWrote.INT8
                self.norm_fn.launch((S, heads), THREADS, stream=st, proj=acts.proj, gnorm_w=address(wvec(l.gnorm)),
                                    workspace=address(ws), out=acts.mix, n_slots=S, amax_out=address(amax))
            else:
                kv = kv_layer(dec, l)
                self.attention.prepare(proj=acts.proj.ptr, T=S, pos0=0, q_norm=wvec(l.q_norm),
                                       k_norm=wvec(l.k_norm), inv_freq=wvec(dec.layout.inv_freq), kv=kv,
                                       max_context=dec.max_context, workspace=self.q_ws.ptr, depth=depth,
                                       pos0_at=self.pos0.ptr, stream=st)
                self.tree_attention.enqueue(S, bodies, q_ws=self.q_ws.ptr, proj=acts.proj.ptr, kv=kv, anc=anc,
                                              depth=depth, out=acts.mix.ptr, pos0_at=self.pos0.ptr, amax=amax,
                                              partial=self.att_partial.ptr, arrived=self.att_arrived.ptr, stream=st)
            return MixWrote.MAGNITUDES if amax else MixWrote.ROWS
        return mix

    def _enqueue_pass(self, S: int, bodies: tuple[bool, bool], in_place: bool = False,
                      sampling: SamplingParams | None = None) -> None:
        """Queue a whole verify pass of S slots on ``self.stream``, its attention in ``bodies``: every argument is
        fixed by (S, bodies) (the tree, the tokens and pos0 live in device memory), so one captured graph per pair
        serves every step. With ``sampling`` (fused; a one-slot decode step) its token is sampled (rows_sample)."""
        st, acts = self.stream, self.acts
        enqueue_layers(self.weights, self.dec, self.pf, acts, self.tokens.ptr, S, self._mix(S, bodies, in_place), st,
                       after_layer=self.draft.capture_hook(st) if self.draft else None)
        ss, ss_parts = self.weights.gemm.ss_for_readers(acts.ss.ptr, self.pf["ss_parts"], self.slots, S)
        self.weights.lm_head(acts.xn.ptr, S, ss, ss_parts, self.slots, self.logits.ptr, st)
        if sampling is None:
            self._enqueue_argmax(S)
        else:
            self._enqueue_sample(S, sampling)

    def _enqueue_argmax(self, S: int, n_cols: int | None = None) -> None:
        """argmax [s] = the greedy token of logits row s, for s < S (rows_argmax), rows of ``n_cols`` (the
        vocabulary's unless given: the tests' other lengths)."""
        n_cols = self.config.vocab_size if n_cols is None else n_cols
        self.argmax_fn.launch((S, self._argmax_slices(S)), THREADS, stream=self.stream,
                              logits=self.logits, n_cols=n_cols, partial_v=self.argmax_v, partial_i=self.argmax_i,
                              arrived=self.argmax_arrived, tokens=self.argmax)

    def _sampler(self):
        """rows_sample (its own module: lucegen/families/rows_sample.py), loaded once."""
        if self.sample_fn is None:
            self.sample_module = self.device.load(codegen.build(self.target, "rows_sample"))
            self.sample_fn = self.sample_module.function("rows_sample", programmatic=True)
        return self.sample_fn

    def _enqueue_sample(self, S: int, sampling: SamplingParams) -> None:
        """argmax [s] = the sampled token of logits row s of a one-slot decode chain at pos0 (rows_sample: row s's
        token takes position pos0 + 1 + s), over the vocabulary."""
        self._sampler().launch((S, self._argmax_slices(S)), THREADS, stream=self.stream, logits=self.logits,
                               n_cols=self.config.vocab_size, partial_v=self.argmax_v, partial_i=self.argmax_i,
                               arrived=self.argmax_arrived, tokens=self.argmax, pos0=self.pos0,
                               sample_seed=sampling.seed, temperature=sampling.temperature)

    def _replay(self, graphs: dict, key, enqueue) -> None:
        """Run ``enqueue()`` on the stream: as the graph ``graphs[key]``, captured the first time, or directly
        without graphs."""
        if not self.use_graphs:
            enqueue()
            return
        graph = graphs.get(key)
        if graph is None:
            self.stream.begin_capture()
            try:
                enqueue()
            finally:
                graph = self.stream.end_capture()
            graphs[key] = graph
        graph.launch(self.stream)

    def _run_pass(self, S: int) -> None:
        """A verify pass of S slots: its step inputs from ``step_in_host``, its greedy tokens into ``argmax_host``."""
        bodies = self.tree_attention.bodies(S, self.dec.position)

        def enqueue():
            self.device.upload_pinned_async(self.step_in_host, self.step_in, self.stream)
            self._enqueue_pass(S, bodies)
            self.device.download_pinned_async(self.argmax, self.argmax_host, self.stream)
        self._replay(self._graphs, (S, bodies), enqueue)

    def verify(self, tree: ddtree.Tree, root_token: int, *, logits: bool = False):
        """The target's greedy token after every slot of ``[root] + tree`` (int64 [1 + n]; with ``logits`` also the
        f32 logits [1 + n, vocab]). Changes no committed state: the slots' K/V go to cache rows past the position."""
        c, dec = self.config, self.dec
        S = tree.n_nodes + 1
        if S > self.slots:
            raise LucegenError(f"tree of {tree.n_nodes} nodes exceeds the verifier's budget of {self.budget}")
        if dec.position + S > dec.max_context:
            raise LucegenError(f"{dec.position} tokens so far + a verify batch of {S} exceed the allocated context "
                               f"of {dec.max_context} (--max-context)")
        tokens = tree.verify_tokens(int(root_token))
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise LucegenError(f"verify token id out of range [0, {c.vocab_size})")
        # step_in_host is free: the last verify's graph, its only reader, ran before that verify returned
        write_step_inputs(self.step_in_host.array, dec.position, tokens, tree_layout(tree), self.slots)
        self._run_pass(S)
        self._verified = S  # the commit replays the updates this pass left in the layer workspaces
        self.stream.synchronize()
        argmax = self.argmax_host.array[:S].astype(np.int64)
        if logits:
            return argmax, self.device.download(self.logits, np.float32, (S, c.vocab_size))
        return argmax

    def _argmax_slices(self, S: int) -> int:
        """Blocks per logits row of rows_argmax: two per compute unit over the S rows (a row of the vocabulary is
        ~1 MB of f32: one block alone takes ~50 us on the H100)."""
        return max(1, min(ARGMAX_MAX_SLICES, -(-2 * self.target.compute_units // S)))

    def _warps_per_block(self) -> int:
        """Warps a block of the tree kernels that give each warp one item: tree_gated_norm (a value head) and
        tree_commit_deltanet (a value column); the template's TV_NW."""
        return THREADS // self.target.warp_size

    def _column_blocks(self) -> int:
        return -(-self.pf["NV"] * self.pf["DV"] // self._warps_per_block())

    def _rule_blocks(self) -> int:
        """tree_delta_rule's blocks of ``rule_columns`` value columns (a block's lie in one head)."""
        return self.pf["NV"] * self.pf["DV"] // self.rule_columns

    def rule_stage_bytes(self, slots: int) -> int:
        """Shared memory of a tree_delta_rule block over ``slots`` slots: S (2 DK + 3 COLS + 3) + rule_round
        rule_threads words, laid out as the comment above the kernel in templates/dflash/tree_verify.cu.j2 says."""
        rule_round = self.target.tuning.tree_verify.rule_round
        return 4 * (slots * (2 * self.pf["DK"] + 3 * self.rule_columns + 3) + rule_round * self.rule_threads)

    def _layer_ws(self, l) -> int:
        """The device address of DeltaNet layer ``l``'s workspace (kept from the verify to the commit)."""
        return self.ws.ptr + 4 * l.slot * self.slots * ws_floats(self.pf)

    def _commit_deltanet(self, path_len: int, slots: int) -> None:
        """Replay the accepted path (``self.path``, ``path_len`` slots of a ``slots``-slot pass) over every DeltaNet
        layer's state; its last slot's conv window becomes the live one."""
        lay = self.dec.layout
        if lay.n_dn:
            self.commit_dn_fn.launch((self._column_blocks(), lay.n_dn), THREADS, stream=self.stream,
                                     workspaces=self.ws, ws_layer_stride=self.slots * ws_floats(self.pf),
                                     windows=self.windows, windows_layer_stride=self.slots * lay.conv_window_floats,
                                     recurrent=self.dec.recurrent, conv=self.dec.conv, path=self.path,
                                     n=path_len - 1, n_slots=slots)

    def commit(self, tree: ddtree.Tree, accepted, bonus: int) -> None:
        """Make the root and the ``accepted`` nodes (``ddtree.accept``'s, root's child first) part of the sequence:
        the last accepted slot's DeltaNet states and conv windows become the live ones, the path's KV rows move to
        their sequence positions; the decoder's position advances by 1 + len(accepted) and ``bonus`` becomes its
        next token (the next step's root)."""
        dec, lay, st = self.dec, self.dec.layout, self.stream
        path = np.concatenate([[0], np.asarray(accepted, np.int64) + 1]).astype(np.int32)
        if np.any(tree.verify_parents()[path[1:]] != path[:-1]):
            raise LucegenError(f"commit: nodes {list(accepted)} are not a path from the root of the tree")
        S = tree.n_nodes + 1
        if self._verified != S:
            raise LucegenError(f"commit: the last verify was not of this tree ({S} slots; verified: {self._verified})")
        self._verified = None  # the commit consumes the pass
        self.device.upload_async(path, self.path, st)
        self._commit_deltanet(int(path.size), S)
        if lay.n_at and path.size > 1:
            c = self.config
            self.commit_kv_fn.launch((-(-2 * c.num_kv_heads * c.head_dim // THREADS), lay.n_at), THREADS, stream=st,
                                     kv_all=dec.kv, layer_bytes=dec.kv_layer_bytes, max_context=dec.max_context,
                                     path=self.path, n=int(path.size) - 1, pos0=dec.position)
        st.synchronize()
        dec.position += int(path.size)
        dec.next_token = int(bonus)

    # ------------------------------------------------------------------------------------------ plain greedy
    def _enqueue_decode_step(self, bodies: tuple[bool, bool], sampling: SamplingParams | None = None) -> None:
        """One greedy (or fused ``sampling``) step on the device: the one-slot pass at pos0 with tokens[0] (its
        attention in ``bodies``), its DeltaNet state and conv window written in place (what committing its slot
        would copy), then tree_greedy_advance (argmax -> tokens[0] and history[pos0], pos0 + 1)."""
        self._enqueue_pass(1, bodies, in_place=True, sampling=sampling)
        self.advance_fn.launch(1, 32, stream=self.stream, argmax=self.argmax, tokens=self.tokens, pos0=self.pos0,
                               history=self.history)

    def decode(self, n: int, *, sampling: SamplingParams | None = None) -> list[int]:
        """Plain decoding of ``n`` tokens (the first being the decoder's next token) with every step queued on the
        device and no host work in between: the same passes and commits as :meth:`greedy`, so the same tokens, at
        the speed of the kernels. ``sampling`` (a SamplingParams; None or temperature 0: greedy): temperature alone
        is sampled on the device (rows_sample); with top-k, top-p or min-p each step's token is drawn on the host
        from its logits (:meth:`greedy`'s loop). The decoder's position and next token advance."""
        sampling = checked_sampling(sampling)
        if sampling is not None and not fused(sampling):
            return self.greedy(n, sampling=sampling)
        dec = self.dec
        if dec.next_token is None:
            raise LucegenError("decode: prefill the prompt first")
        if n < 1 or dec.position + n > dec.max_context:
            raise LucegenError(f"decode: {dec.position} tokens so far + {n} exceed the allocated context of "
                               f"{dec.max_context} (--max-context)")
        if sampling is not None:
            self._sampler()  # loaded before any capture
            # the seed and temperature are the captured launches' arguments: the graphs of another pair go
            stale = [k for k in self._decode_graphs if isinstance(k[0], tuple) and k[1:] != (sampling.seed,
                                                                                            sampling.temperature)]
            for k in stale:
                self._decode_graphs.pop(k).destroy()
        root = tree_layout(ddtree.chain(np.zeros(0, np.int64)))
        self.device.upload_async(step_inputs(dec.position, np.array([dec.next_token]), root, self.slots),
                                 self.step_in, self.stream)
        for position in range(dec.position, dec.position + n - 1):  # the step's pos0, advanced on the device
            bodies = self.tree_attention.bodies(1, position)
            key = bodies if sampling is None else (bodies, sampling.seed, sampling.temperature)
            self._replay(self._decode_graphs, key, lambda: self._enqueue_decode_step(bodies, sampling))
        self.stream.synchronize()
        out = [dec.next_token]
        if n > 1:
            steps = Buffer(self.history.ptr + 4 * dec.position, 4 * (n - 1), None)
            out += self.device.download(steps, np.int32, (n - 1,)).astype(int).tolist()
        dec.position += n - 1
        dec.next_token = out[-1]
        return out

    def greedy(self, n: int, callback=None, *, sampling: SamplingParams | None = None) -> list[int]:
        """Plain decoding through this verifier (one-slot trees) from the decoder's next token: ``n`` tokens, the
        first being that next token; greedy, or each token drawn on the host from the pass's logits with
        ``sampling`` (lucegen/model/sampling.py's sample). What a lossless speculative run through the same verifier
        must emit (greedy: token for token; sampled: in distribution)."""
        sampling = checked_sampling(sampling)
        if self.dec.next_token is None:
            raise LucegenError("greedy: prefill the prompt first")
        empty = ddtree.chain(np.zeros(0, np.int64))
        out = [self.dec.next_token]
        while len(out) < n:
            root = out[-1]
            if sampling is None:
                bonus = int(self.verify(empty, root)[0])
            else:
                bonus = sample(self.verify(empty, root, logits=True)[1][0], sampling, self.dec.position + 1)
            self.commit(empty, [], bonus)
            out.append(bonus)
            if callback:
                callback([bonus])
        return out[:n]
