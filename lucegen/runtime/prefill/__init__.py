"""Prefill: the prompt through tensor-core GEMMs, the chunked gated delta rule and causal flash attention.

``lucegen.families.prefill.prefill_params(config, target)`` is the ``pf`` dict every ``templates/prefill/*.cu.j2``
renders with; ``gemm.py``, ``deltanet.py`` and ``attention.py`` load one kernel module each (``codegen.build``) and
own its launch geometry; ``runner.py`` strings them into a forward pass over the megakernel decoder's weights and
state.
"""
