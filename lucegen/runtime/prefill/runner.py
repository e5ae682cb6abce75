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

import numpy as np

from ... import codegen
from ...compile import compile_source
from ...errors import LucegenError
from ..device import Buffer, address
from .attention import AttentionKernels
from .deltanet import DeltaNetKernels
from .gemm import GemmKernels, argmax_from_key
from .params import prefill_params

EMBED_THREADS = 256  # templates/prefill/common.cu.j2


class Prefiller:
    """Whole-prompt prefill into a :class:`MegakernelDecoder`'s state. ``segment`` caps the tokens per pass (the
    workspace is sized for it); longer prompts run as several segments, each continuing from the state."""

    def __init__(self, decoder, *, segment: int | None = None, graphs: bool = True):
        self.dec = decoder
        self.device, self.target, self.config = decoder.device, decoder.target, decoder.config
        self.pf = prefill_params(self.config, self.target)
        dev, t, pf = self.device, self.target, self.pf
        self.gemm = GemmKernels(dev, t, pf)
        self.deltanet = DeltaNetKernels(dev, t, pf)
        self.attention = AttentionKernels(dev, t, pf)
        source = codegen.render(t, "prefill/common.cu.j2", pf=pf)
        self.common = dev.load(compile_source(t, "prefill_common", source, template="prefill/common.cu.j2"))
        self.embed_fn = self.common.function("prefill_embed")
        want = segment or t.prefill.max_tokens
        if not isinstance(want, int) or want < 1:
            raise LucegenError(f"prefill segment must be a positive integer, got {want!r}")
        self.segment = min(want, decoder.max_context)
        self.use_graphs = graphs
        self.stream = dev.stream()
        self._graphs: dict[tuple[int, int, bool], object] = {}
        self._allocate()

    # ------------------------------------------------------------------------------------------ memory
    def _allocate(self) -> None:
        c, pf, s, d = self.config, self.pf, self.segment, self.device
        esz = 2  # compute dtype bytes
        self.x = d.alloc(s * c.hidden_size * 4)
        self.xn = d.alloc(s * c.hidden_size * esz)
        self.ss = d.alloc(pf["ss_parts"] * s * 4)
        self.proj = d.alloc(s * max(pf["NIN_DN"], pf["NIN_AT"]) * 4)
        self.mix = d.alloc(s * max(pf["VD"], c.num_attention_heads * c.head_dim) * esz)
        self.act = d.alloc(s * c.intermediate_size * esz)
        self.ws_dn = d.alloc(max(1, self.deltanet.workspace_bytes(s)))
        self.ws_at = d.alloc(max(1, self.attention.workspace_bytes(s)))
        # split-K partial sums of the residual GEMMs (only short segments split: see gemm.plan_residual)
        self.ws_resid_bytes = self.gemm.residual_workspace_bytes(min(s, 2048), c.hidden_size)
        self.ws_resid = d.alloc(self.ws_resid_bytes)
        self.tokens = d.alloc(max(1, self.dec.max_context) * 4)
        self.logits = d.alloc(c.vocab_size * 4)
        self.argmax = d.alloc(16)

    def close(self) -> None:
        for g in self._graphs.values():
            g.destroy()
        self._graphs.clear()
        for name in ("x", "xn", "ss", "proj", "mix", "act", "ws_dn", "ws_at", "ws_resid", "tokens", "logits", "argmax"):
            b = getattr(self, name, None)
            if isinstance(b, Buffer):
                b.free()

    # ------------------------------------------------------------------------------------------ one segment
    def _wmat(self, elem_offset: int) -> int:
        return self.dec.wmat.ptr + 2 * elem_offset

    def _wvec(self, float_offset: int) -> int:
        return self.dec.wvec.ptr + 4 * float_offset

    def _enqueue_segment(self, tok_offset: int, T: int, pos0: int, last: bool) -> None:
        """Queue one segment's kernels on ``self.stream``: tokens[tok_offset : tok_offset+T] at positions pos0.."""
        c, pf, dec, st = self.config, self.pf, self.dec, self.stream
        lay = dec.layout
        H, I = c.hidden_size, c.intermediate_size
        seg = self.segment
        x, xn, ss, proj, mix, act = (b.ptr for b in (self.x, self.xn, self.ss, self.proj, self.mix, self.act))
        ss_parts = pf["ss_parts"]
        layers = lay.layers
        self.embed_fn.launch(T, EMBED_THREADS,
                             (address(self.tokens.ptr + 4 * tok_offset), address(self._wmat(lay.embed)),
                              address(self._wvec(layers[0].in_norm)), address(x), address(xn), address(ss), np.int32(seg)),
                             stream=st)
        at_out = c.num_attention_heads * c.head_dim
        resid_ws = {"workspace": self.ws_resid.ptr, "workspace_bytes": self.ws_resid_bytes}
        for i, l in enumerate(layers):
            next_norm = layers[i + 1].in_norm if i + 1 < len(layers) else lay.final_norm
            if l.kind == 0:
                n_in, k_out = pf["NIN_DN"], pf["VD"]
            else:
                n_in, k_out = pf["NIN_AT"], at_out
            self.gemm.rows_f32(xn, H, self._wmat(l.in_mat), H, T, n_in, H, ss, ss_parts, seg, proj, n_in, stream=st)
            if l.kind == 0:
                conv = dec.conv.ptr + 4 * l.slot * c.conv_dim * (c.conv_kernel - 1)
                rec = dec.recurrent.ptr + 4 * l.slot * (c.linear_num_value_heads * c.linear_value_head_dim
                                                        * c.linear_key_head_dim)
                self.deltanet.run(proj=proj, T=T, conv_w=self._wvec(l.conv_w), a_log=self._wvec(l.a_log),
                                  dt_bias=self._wvec(l.dt_bias), gnorm_w=self._wvec(l.gnorm), conv_state=conv,
                                  recurrent=rec, out=mix, workspace=self.ws_dn.ptr, stream=st)
            else:
                kv = dec.kv.ptr + 2 * l.slot * 2 * c.num_kv_heads * dec.max_context * c.head_dim
                self.attention.run(proj=proj, T=T, pos0=pos0, q_norm=self._wvec(l.q_norm),
                                   k_norm=self._wvec(l.k_norm), inv_freq=self._wvec(lay.inv_freq), kv=kv,
                                   max_context=dec.max_context, out=mix, workspace=self.ws_at.ptr, stream=st)
            self.gemm.residual(mix, k_out, self._wmat(l.out_mat), k_out, T, H, k_out, x, H,
                               self._wvec(l.post_norm), xn, H, ss, seg, stream=st, **resid_ws)
            self.gemm.swiglu(xn, H, self._wmat(l.gateup), H, T, 2 * I, H, ss, ss_parts, seg, act, I, stream=st)
            self.gemm.residual(act, I, self._wmat(l.down), I, T, H, I, x, H, self._wvec(next_norm), xn, H, ss, seg,
                               stream=st, **resid_ws)
        if last:  # final norm (folded into xn, row scale from ss) + lm_head on the last row with its argmax
            row = T - 1
            self.device.memset_async(self.argmax.ptr, 8, st)
            self.gemm.rows_f32(xn + 2 * row * H, H, self._wmat(lay.lm_head), H, 1, c.vocab_size, H,
                               ss + 4 * row, ss_parts, seg, self.logits.ptr, c.vocab_size, stream=st,
                               argmax_key=self.argmax.ptr)

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

    def prefill(self, tokens, *, logits: bool = False):
        """Prefill ``tokens`` from the decoder's current position; returns the greedy next token (and the last
        position's logits when asked). The decoder's position and ``next_token`` advance."""
        n = self.stage(tokens)
        self.launch(n)
        self.stream.synchronize()
        nxt = argmax_from_key(self.device.download(self.argmax, np.uint64, (1,))[0])
        self.dec.position += n
        self.dec.next_token = nxt
        if logits:
            return nxt, self.device.download(self.logits, np.float32, (self.config.vocab_size,))
        return nxt
