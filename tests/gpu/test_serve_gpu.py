"""lucegen serve on the GPU engines (one slot): greedy requests give lucegen.LLM's own text alone and with 8
requests queued behind each other, sampled requests repeat with a seed, ``bench serve`` runs against it, and
stopping the server frees every allocation of the engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import lucegen
from lucegen.bench.serve import bench_serve

from gpu_models import checkpoint_dir, gguf_file, gpu_device  # tests/gpu/gpu_models.py
from serve_helpers import ServerThread  # tests/serve_helpers.py

pytestmark = pytest.mark.gpu

PROMPTS = [[3, 17, 29, 41, 5, 60, 7, 88], [9, 8, 7, 6, 5], [100, 200, 300, 12, 14, 16, 18, 20, 22]]


@pytest.mark.parametrize("kind", ["megakernel", "quantised"])
def test_served_text_alone_and_under_load(kind):
    dev = gpu_device()
    before = dev.allocated
    path = checkpoint_dir("tiny") if kind == "megakernel" else gguf_file("tiny-q")
    llm = lucegen.LLM(path, device=dev, max_context=256)
    want = [llm.generate(p, max_tokens=24).text for p in PROMPTS]
    srv = ServerThread(llm, slots=1, queue_size=16)
    try:
        def body(i):
            return {"model": "tiny", "prompt": PROMPTS[i % 3], "max_tokens": 24, "temperature": 0}

        alone = [srv.post("/v1/completions", json=body(i)).json()["choices"][0]["text"] for i in range(3)]
        assert alone == want

        async def load():
            async with httpx.AsyncClient(timeout=120) as http:
                return await asyncio.gather(*(http.post(srv.url + "/v1/completions", json=body(i))
                                              for i in range(9)))

        assert [r.json()["choices"][0]["text"] for r in asyncio.run(load())] == want * 3
        sampled = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0.8, "seed": 5}
        assert srv.post("/v1/completions", json=sampled).json()["choices"][0]["text"] == \
            srv.post("/v1/completions", json=sampled).json()["choices"][0]["text"]
        result = bench_serve(srv.url, "tiny", clients=(1, 4), requests=2, prompt_tokens=32, gen_tokens=16, turns=2)
        assert all(row["aggregate_tok_s"] > 0 for row in result["rows"])
    finally:
        srv.stop()
    assert llm.engine is None and dev.allocated == before
