"""The device sampler's kernels build for every descriptor: the megakernel's sampled instance (mk.sampling, which
lucegen build does not render: the runtime compiles it on first use) and rows_sample, each declaring the seed and
temperature parameters; the greedy instance renders without them."""

from __future__ import annotations

import pytest

from lucegen import codegen
from lucegen.families.megakernel import DEFAULT_MODEL, KERNEL_NAME, kernel_params
from lucegen.model.config import ModelConfig
from lucegen.runtime.device import source_parameters
from lucegen.target import list_targets, load_target


@pytest.mark.parametrize("name", list_targets())
def test_sampled_megakernel_and_rows_sample_compile(name, require_compiler):
    target = load_target(name)
    require_compiler(target)
    config = ModelConfig.preset(DEFAULT_MODEL)
    greedy = codegen.render_family(target, "megakernel", params={"mk": kernel_params(config, target)})
    assert "lg_gumbel_noise" not in greedy and "sample_seed" not in greedy
    compiled = codegen.build(target, "megakernel", params={"mk": kernel_params(config, target, sampling=True)})
    params = source_parameters(compiled.source)[KERNEL_NAME]
    assert [p.split()[-1] for p in params[-2:]] == ["sample_seed", "temperature"]
    assert "void lm_head_screen_phase" not in compiled.source and "lg_gumbel_noise" in compiled.source
    assert "void lm_head_screen_phase" in greedy or not kernel_params(config, target)["lm_screen"]
    rows = codegen.build(target, "rows_sample")
    assert [k.name for k in rows.kernels] == ["rows_sample"]
