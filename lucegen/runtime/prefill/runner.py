"""Prefill a prompt on the device: the decode megakernel's weights and state, advanced by whole-prompt kernels.

    dec = MegakernelDecoder(model_dir, max_context=4096)
    pre = Prefiller(dec)
    first = pre.prefill(prompt_ids)      # KV cache, conv and recurrent state now hold the prompt; greedy next token
    ids = dec.generate(128)              # decode continues from exactly that state, no host-side conversion

One prefill segment of T tokens (positions pos0 .. pos0+T-1) is, per layer (see the contract in
``lucegen/runtime/prefill/__init__.py`` and the kernels' templates):

    proj = gemm_rows_f32(xn, in_mat) * r            r = rsqrt(mean x^2 + eps): the RMSNorm as a GEMM row scale
    mix  = DeltaNetKernels.run(proj) | AttentionKernels.run(proj)   token mixing, state updated in place
    x   += gemm(mix, out_mat); xn, ss for the post-attention norm   (gemm_residual epilogue)
    act  = gemm_swiglu(xn, gateup) * r
    x   += gemm(act, down); xn, ss for the next norm

then, after the last segment, the final norm + lm_head on the last row and its argmax. Every launch goes on one
stream; a segment is captured once as a CUDA graph per (T, pos0) and replayed.
"""

from __future__ import annotations

import enum

import numpy as np

from ... import codegen
from ...errors import LucegenError
from ...model.sampling import sample
from ..device import Buffer, address
from ..device_sampling import checked_sampling
from .attention import AttentionKernels
from .deltanet import DeltaNetKernels
from .gemm import GemmKernels, argmax_from_key

EMBED_THREADS = 256  # templates/prefill/common.cu.j2


def load_common(device, target, pf: dict):
    """The prefill's small-kernel module (``prefill_embed``) for this model shape, loaded on ``device``."""
    return device.load(codegen.build(target, "prefill_common", params={"pf": pf}))


def wmat_at(dec, elem_offset: int) -> int:
    """Device address of a packed matrix (element offset into the decoder's wmat, compute dtype)."""
    return dec.wmat.ptr + 2 * elem_offset


def wvec_at(dec, float_offset: int) -> int:
    """Device address of a packed vector (float offset into the decoder's wvec)."""
    return dec.wvec.ptr + 4 * float_offset


def kv_layer(dec, layer) -> int:
    """Device address of attention ``layer``'s KV cache (rows [2][NKV][max_context] in the decoder's ``kv_format``)
    in the decoder's state."""
    return dec.kv.ptr + layer.slot * dec.kv_layer_bytes


def conv_layer(dec, layer) -> int:
    """Device address of DeltaNet ``layer``'s conv window in the decoder's state."""
    return dec.conv.ptr + 4 * layer.slot * dec.layout.conv_window_floats


def recurrent_layer(dec, layer) -> int:
    """Device address of DeltaNet ``layer``'s recurrent state in the decoder's state."""
    return dec.recurrent.ptr + 4 * layer.slot * dec.layout.recurrent_state_floats


class Activations:
    """The per-row buffers of the layer loop for up to ``rows`` rows: residual stream ``x`` (f32), its normed copy
    ``xn`` (compute dtype) with the RMSNorm partial sums ``ss``, the in-projection ``proj`` (f32), the token mix's
    output ``mix`` and the MLP activation ``act`` (compute dtype). With ``pf["int8"]`` (a quantised target with
    int8-activation groups) also ``xn_amax``, ``mix_amax``, ``act_amax``: the GEMM inputs' magnitudes per 16 values
    (QuantGemm.amax), which those groups read."""

    NAMES = ("x", "xn", "ss", "proj", "mix", "act")
    MAGNITUDES = ("xn_amax", "mix_amax", "act_amax")

    @staticmethod
    def row_bytes(config, pf: dict) -> dict[str, int]:
        """Bytes per row of each buffer (what lucegen.runtime.memory_plan counts per verify slot)."""
        c, esz = config, 2  # compute dtype bytes
        # ss: the parts its readers take (ss_parts), or more where a residual writes more (ss_scratch)
        out = {"x": 4 * c.hidden_size, "xn": esz * c.hidden_size, "ss": 4 * pf.get("ss_scratch", pf["ss_parts"]),
               "proj": 4 * max(pf["NIN_DN"], pf["NIN_AT"]),
               "mix": esz * max(pf["VD"], c.num_attention_heads * c.head_dim), "act": esz * c.intermediate_size}
        if pf.get("int8"):  # one 2-byte magnitude per 16 values
            out.update({f"{name}_amax": out[name] // 16 for name in ("xn", "mix", "act")})
        return out

    def __init__(self, device, config, pf: dict, rows: int):
        self.rows = rows
        for name, size in self.row_bytes(config, pf).items():
            setattr(self, name, device.alloc(rows * size))

    def magnitudes(self, name: str) -> int:
        """Device address of ``name``'s magnitudes per 16 values, 0 where this loop keeps none."""
        b = getattr(self, f"{name}_amax", None)
        return b.ptr if b is not None else 0

    def free(self) -> None:
        for name in self.NAMES + self.MAGNITUDES:
            b = getattr(self, name, None)
            if isinstance(b, Buffer):
                b.free()


class LayerWeights:
    """What every decoder's ``layer_weights(pf)`` returns: the target's matrices for the layer loop, and the
    embedding and lm_head a DFlash draft borrows.

    - ``gemm``: ``rows_f32`` / ``swiglu`` / ``residual`` (the signatures of :class:`GemmKernels`) and
      ``matrix(layout offset)``, what ``gemm`` takes as W;
    - ``embed(tokens, T, x, xn, ss, ss_stride, stream, norm=None)``: start the residual stream of T rows, normed by
      ``norm`` (device f32, zero-centred like the target's norms; default the target's layer-0 input norm), leaving
      ``embed_ss_parts`` RMSNorm partial sums per row in ``ss`` (what the GEMM reading those rows must be given,
      through ``gemm.ss_for_readers``), and ``embed_ss_scratch`` rows of ss written in all;
    - ``lm_head(...)``: the logits of final-normed rows."""

    dec: object
    gemm: object
    embed_ss_parts: int
    embed_ss_scratch: int

    def matrix(self, offset: int):
        raise NotImplementedError

    def embed(self, tokens: int, T: int, x: int, xn: int, ss: int, ss_stride: int, stream, *,
              norm: int | None = None) -> None:
        raise NotImplementedError

    def input_ss_parts(self, layer: int, ss_parts: int) -> int:
        """The RMSNorm partial sums per row that layer ``layer``'s input carries: the embedding's before the first
        layer, a residual GEMM's (``ss_parts``) after every other."""
        return self.embed_ss_parts if layer == 0 else ss_parts

    def first_norm(self) -> int:
        """Device address of the target's layer-0 input norm (the embedding's default norm)."""
        return wvec_at(self.dec, self.dec.layout.layers[0].in_norm)

    def lm_head(self, xn: int, M: int, ss: int, ss_parts: int, ss_stride: int, logits: int, stream, *,
                argmax_key: int = 0) -> None:
        """logits f32 [M, vocab] of M final-normed rows (``xn`` compute dtype, row stride hidden size; ``ss`` their
        ``ss_parts`` partial sums, part j of row m at ``j * ss_stride + m``). ``argmax_key``: as ``gemm.rows_f32``."""
        c = self.dec.config
        H, V = c.hidden_size, c.vocab_size
        self.gemm.rows_f32(xn, H, self.matrix(self.dec.layout.lm_head), H, M, V, H, ss, ss_parts, ss_stride, logits,
                           V, stream=stream, argmax_key=argmax_key)


class DenseWeights(LayerWeights):
    """The layer loop's weights as :class:`MegakernelDecoder` packs them (compute-dtype ``wmat``) on the prefill
    GEMMs; ``batch_invariant``: one tiling whatever the row count (a verify pass)."""

    def __init__(self, dec, pf: dict, *, batch_invariant: bool = False):
        self.dec = dec
        self.gemm = GemmKernels(dec.device, dec.target, pf)
        if batch_invariant:
            self.gemm.make_batch_invariant()
        self.embed_fn = load_common(dec.device, dec.target, pf).function("prefill_embed")
        self.embed_ss_parts = self.embed_ss_scratch = pf["ss_parts"]  # prefill/common.cu.j2: a part per tile_n columns

    def matrix(self, offset: int) -> int:
        return wmat_at(self.dec, offset)

    def embed(self, tokens: int, T: int, x: int, xn: int, ss: int, ss_stride: int, stream, *,
              norm: int | None = None) -> None:
        """x, xn, ss of T rows from device int32 ``tokens``: the compute-dtype embedding rows (``prefill_embed``)."""
        self.embed_fn.launch(T, EMBED_THREADS, stream=stream, tokens=address(tokens),
                             embed=address(self.matrix(self.dec.layout.embed)),
                             norm_w=address(self.first_norm() if norm is None else norm), x=address(x), xn=address(xn),
                             ss=address(ss), ss_stride=ss_stride)


class MixWrote(enum.Enum):
    """What a layer loop's ``mix`` left for the out-projection (:func:`enqueue_layers`)."""
    ROWS = "rows"  # acts.mix alone
    MAGNITUDES = "magnitudes"  # acts.mix and its magnitudes per 16 values (the ``amax`` it was given)
    INT8 = "int8"  # the out-projection's int8 activations (the ``int8`` it was given), not acts.mix


def enqueue_layers(weights, dec, pf: dict, acts: Activations, tokens: int, T: int, mix, stream,
                   resid_ws: dict | None = None, after_layer=None) -> None:
    """Queue the embedding and every layer for ``T`` rows (device int32 ``tokens``), the prefill contract:

        proj = gemm_rows_f32(xn, in_mat) * r;   mix(layer, T, amax, int8) queues the token mixing proj -> acts.mix;
        x += gemm(mix, out_mat);   act = gemm_swiglu(xn, gateup) * r;   x += gemm(act, down)

    on ``weights`` (a decoder's ``layer_weights``, a :class:`LayerWeights`), leaving the final-normed rows in
    ``acts.xn`` / ``acts.ss`` for the lm_head. ``resid_ws``: the residual GEMMs' split-K workspace (``workspace``,
    ``workspace_bytes``), or None for the unsplit GEMMs. ``mix``'s ``amax`` (0: none) is where the out-projection
    wants its input's magnitudes per 16 values (int8-activation groups), and ``int8`` (None: none) where a mixer that
    holds whole 256-value blocks may write the out-projection's int8 activations instead (QuantGemm.prequantised);
    it returns a :class:`MixWrote`, and ``gemm.amax`` follows where magnitudes are wanted and not written.
    ``after_layer(i, T, x)`` queues work that reads layer i's output rows (the residual stream ``x``, f32 [T, H]): a
    draft's capture."""
    c, lay, seg, gemm = dec.config, dec.layout, acts.rows, weights.gemm
    H, I = c.hidden_size, c.intermediate_size
    x, xn, ss, proj, out, act = (getattr(acts, n).ptr for n in Activations.NAMES)
    ss_parts, layers = pf["ss_parts"], lay.layers
    wmat, wvec = weights.matrix, (lambda off: wvec_at(dec, off))
    at_out = c.num_attention_heads * c.head_dim
    resid_ws = resid_ws or {}
    # int8-activation groups (a quantised target's): each GEMM input's magnitudes per 16 values, written by the
    # epilogue that produces it (the residuals' xn, the SwiGLU's act) or, after the embedding and the token mix, by
    # QuantGemm.amax
    xn_am, mix_am, act_am = (acts.magnitudes(n) for n in ("xn", "mix", "act"))
    reads = (lambda am: {"a_amax": am}) if xn_am else (lambda am: {})
    writes = (lambda am: {"amax_out": am}) if xn_am else (lambda am: {})
    # a residual whose rows the GEMM right after it reads (every one but the last layer's, which the lm_head reads
    # later): their RMSNorm totals may be made by that reader's quantiser (QuantGemm.residual)
    then_read = (lambda read: {"totals_by_reader": read}) if xn_am else (lambda read: {})
    weights.embed(tokens, T, x, xn, ss, seg, stream)
    if xn_am:
        gemm.amax(xn, H, T, H, xn_am, stream=stream)
    for i, l in enumerate(layers):
        next_norm = layers[i + 1].in_norm if i + 1 < len(layers) else lay.final_norm
        n_in, k_out = (pf["NIN_DN"], pf["VD"]) if l.kind == 0 else (pf["NIN_AT"], at_out)
        in_ss, in_parts = gemm.ss_for_readers(ss, weights.input_ss_parts(i, ss_parts), seg, T)
        gemm.rows_f32(xn, H, wmat(l.in_mat), H, T, n_in, H, in_ss, in_parts, seg, proj, n_in, stream=stream,
                      **reads(xn_am))
        mix_reads = mix_am and wmat(l.out_mat).int8  # its magnitudes: from the mixer, or amax
        wrote = mix(l, T, mix_am if mix_reads else 0,
                    gemm.prequantised(wmat(l.out_mat), T, out, k_out) if mix_reads else None)
        if wrote == MixWrote.ROWS and mix_reads:
            gemm.amax(out, k_out, T, k_out, mix_am, stream=stream)
        prequantised = {"a_prequantised": True} if wrote == MixWrote.INT8 else {}
        gemm.residual(out, k_out, wmat(l.out_mat), k_out, T, H, k_out, x, H, wvec(l.post_norm), xn, H, ss, seg,
                      stream=stream, **resid_ws, **reads(mix_am), **writes(xn_am), **then_read(True), **prequantised)
        gemm.swiglu(xn, H, wmat(l.gateup), H, T, 2 * I, H, *gemm.ss_for_readers(ss, ss_parts, seg, T), seg, act, I,
                    stream=stream, **reads(xn_am), **writes(act_am))
        gemm.residual(act, I, wmat(l.down), I, T, H, I, x, H, wvec(next_norm), xn, H, ss, seg, stream=stream,
                      **resid_ws, **reads(act_am), **writes(xn_am), **then_read(i + 1 < len(layers)))
        if after_layer:
            after_layer(i, T, x)


class Prefiller:
    """Whole-prompt prefill into a :class:`MegakernelDecoder`'s state. ``segment`` caps the tokens per pass (the
    workspace is sized for it); longer prompts run as several segments, each continuing from the state. With a
    ``draft`` (:class:`lucegen.runtime.draft.DFlashDrafter`) every segment's tapped hidden states also become the
    draft's context."""

    token_buffers = 1  # int32 arrays of max_context entries it holds: the prompt's token ids

    def __init__(self, decoder, *, segment: int | None = None, graphs: bool = True, draft=None):
        self.dec, self.draft = decoder, draft
        self.device, self.target, self.config = decoder.device, decoder.target, decoder.config
        self.pf = decoder.layer_params()
        dev, t, pf = self.device, self.target, self.pf
        self.weights = decoder.layer_weights(pf)
        self.gemm = self.weights.gemm
        self.deltanet = DeltaNetKernels(dev, t, pf)
        self.attention = AttentionKernels(dev, t, pf)
        want = segment or t.prefill.max_tokens
        if not isinstance(want, int) or want < 1:
            raise LucegenError(f"prefill segment must be a positive integer, got {want!r}")
        self.segment = min(want, decoder.max_context, draft.rows if draft else want)
        self.use_graphs = graphs
        self.stream = dev.stream()
        self._graphs: dict[tuple[int, int, bool], object] = {}
        self._allocate()

    # ------------------------------------------------------------------------------------------ memory
    def _allocate(self) -> None:
        c, s, d = self.config, self.segment, self.device
        self.acts = Activations(d, c, self.pf, s)
        self.ws_dn = d.alloc(max(1, self.deltanet.workspace_bytes(s)))
        self.ws_at = d.alloc(max(1, self.attention.workspace_bytes(s)))
        # split-K partial sums of the residual GEMMs (only short segments split: see gemm.plan_residual)
        self.ws_resid_bytes = self.gemm.residual_workspace_bytes(min(s, 2048), c.hidden_size)
        self.ws_resid = d.alloc(max(1, self.ws_resid_bytes))
        self.tokens = d.alloc(4 * self.token_buffers * max(1, self.dec.max_context))
        self.logits = d.alloc(c.vocab_size * 4)
        self.argmax = d.alloc(16)

    def close(self) -> None:
        for g in self._graphs.values():
            g.destroy()
        self._graphs.clear()
        if hasattr(self, "acts"):
            self.acts.free()
        for name in ("ws_dn", "ws_at", "ws_resid", "tokens", "logits", "argmax"):
            b = getattr(self, name, None)
            if isinstance(b, Buffer):
                b.free()

    # ------------------------------------------------------------------------------------------ one segment
    def _mix(self, pos0: int):
        """The prefill's token mixing at positions pos0 ..: chunked DeltaNet / causal attention, state in place."""
        dec, st, acts = self.dec, self.stream, self.acts
        wvec = lambda off: wvec_at(dec, off)  # noqa: E731

        def mix(l, T, amax=0, int8=None):  # the output's magnitudes are left to the caller
            if l.kind == 0:
                self.deltanet.run(proj=acts.proj.ptr, T=T, conv_w=wvec(l.conv_w), a_log=wvec(l.a_log),
                                  dt_bias=wvec(l.dt_bias), gnorm_w=wvec(l.gnorm), conv_state=conv_layer(dec, l),
                                  recurrent=recurrent_layer(dec, l), out=acts.mix.ptr, workspace=self.ws_dn.ptr,
                                  stream=st)
            else:
                self.attention.run(proj=acts.proj.ptr, T=T, pos0=pos0, q_norm=wvec(l.q_norm),
                                   k_norm=wvec(l.k_norm), inv_freq=wvec(dec.layout.inv_freq), kv=kv_layer(dec, l),
                                   max_context=dec.max_context, out=acts.mix.ptr, workspace=self.ws_at.ptr, stream=st)
            return MixWrote.ROWS
        return mix

    def _enqueue_segment(self, tok_offset: int, T: int, pos0: int, last: bool) -> None:
        """Queue one segment's kernels on ``self.stream``: tokens[tok_offset : tok_offset+T] at positions pos0.."""
        c, st, acts = self.config, self.stream, self.acts
        H = c.hidden_size
        enqueue_layers(self.weights, self.dec, self.pf, acts, self.tokens.ptr + 4 * tok_offset, T,
                       self._mix(pos0), st, {"workspace": self.ws_resid.ptr, "workspace_bytes": self.ws_resid_bytes},
                       after_layer=self.draft.capture_hook(st) if self.draft else None)
        if self.draft:
            self.draft.enqueue_ingest(T, st, pos0=pos0)
        if last:  # final norm (folded into xn, row scale from ss) + lm_head on the last row with its argmax
            row = T - 1
            self.device.memset_async(self.argmax.ptr, 8, st)
            self.weights.lm_head(acts.xn.ptr + 2 * row * H, 1, acts.ss.ptr + 4 * row, self.pf["ss_parts"],
                                 self.segment, self.logits.ptr, st, argmax_key=self.argmax.ptr)

    def _run_segment(self, tok_offset: int, T: int, pos0: int, last: bool) -> None:
        if not self.use_graphs:
            self._enqueue_segment(tok_offset, T, pos0, last)
            return
        key = (tok_offset, T, pos0, last)
        graph = self._graphs.get(key)
        if graph is None:
            self.stream.begin_capture()
            try:
                self._enqueue_segment(tok_offset, T, pos0, last)
            finally:
                graph = self.stream.end_capture()
            self._graphs[key] = graph
        graph.launch(self.stream)

    # ------------------------------------------------------------------------------------------ API
    def stage(self, tokens) -> int:
        """Check ``tokens`` against the context and vocabulary and upload them; returns how many."""
        dec = self.dec
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = int(tokens.size)
        if n == 0:
            raise LucegenError("prefill: no tokens")
        if dec.position + n > dec.max_context:
            raise LucegenError(f"{dec.position} tokens so far + {n} prompt tokens exceed the allocated context of "
                               f"{dec.max_context} (--max-context)")
        if tokens.min() < 0 or tokens.max() >= self.config.vocab_size:
            raise LucegenError(f"prompt token id out of range [0, {self.config.vocab_size})")
        self.stream.synchronize()  # the token buffer may still feed a queued segment
        self.device.upload(tokens, self.tokens)
        return n

    def launch(self, n: int) -> None:
        """Queue the prefill of the ``n`` staged tokens from the decoder's position (no sync, position unchanged)."""
        done = 0
        while done < n:
            T = min(self.segment, n - done)
            self._run_segment(done, T, self.dec.position + done, last=done + T == n)
            done += T

    def prefill(self, tokens, *, logits: bool = False, sampling=None):
        """Prefill ``tokens`` from the decoder's current position; returns the next token (and the last position's
        logits when asked): the greedy one, or with ``sampling`` (SamplingParams) the reference sampler's draw from
        the last position's logits, made on the host (once per prompt). The decoder's position and ``next_token``
        advance."""
        sampling = checked_sampling(sampling)
        n = self.stage(tokens)
        if self.draft and self.draft.position != self.dec.position:
            raise LucegenError(f"prefill: the draft's context holds {self.draft.position} positions, the target "
                               f"{self.dec.position} (reset both together)")
        self.launch(n)
        self.stream.synchronize()
        if self.draft:
            self.draft.prefilled(n)
        nxt = argmax_from_key(self.device.download(self.argmax, np.uint64, (1,))[0])
        last = None
        if logits or sampling is not None:
            last = self.device.download(self.logits, np.float32, (self.config.vocab_size,))
        if sampling is not None:
            nxt = sample(last, sampling, self.dec.position + n)
        self.dec.position += n
        self.dec.next_token = nxt
        return (nxt, last) if logits else nxt
