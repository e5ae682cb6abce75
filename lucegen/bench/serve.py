"""``lucegen bench serve``: N concurrent streaming clients against a running ``lucegen serve`` (or any
OpenAI-compatible server) over HTTP.

For each concurrency level, every client sends ``requests`` streaming ``/v1/completions`` requests one after
another, each with a prompt of ``prompt_tokens`` words (the server's usage gives its token count)
that no other request shares, and ``max_tokens = gen_tokens``. Measured per request: time to first token (the
first chunk with text), the gaps between chunks (inter-token latency: a chunk is a token on a host-sampling engine,
and an accepted block on a speculative one), and tokens per second after the first. Reported per level: TTFT and
inter-token latency p50 / p95 / p99, the median per-stream tok/s, the aggregate tok/s (all completion tokens over
the level's wall time), and the server's mean acceptance length over the level (from its /metrics, when it reports
one). With ``turns=2`` each request is followed by a second turn that resends the first turn's prompt and reply plus
a few words, and the second turns' TTFT is reported beside the first's (the prefix cache's effect).
"""

from __future__ import annotations

import asyncio
import json
import time

WORDS = ("the river and the mountain city in the summer evening light with music on the water "
         "while the kernel launches a grid of blocks over the shared memory of the chip").split()


def percentile(values, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def prompt_text(tag: str, words: int) -> str:
    return f"{tag}: " + " ".join(WORDS[i % len(WORDS)] for i in range(max(1, words)))


async def _stream(http, url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    stamps, text, usage = [], "", None
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if "error" in data:
                raise RuntimeError(data["error"].get("message"))
            if data.get("usage"):
                usage = data["usage"]
            for choice in data.get("choices", []):
                if choice.get("text"):
                    stamps.append(time.perf_counter())
                    text += choice["text"]
    tokens = usage["completion_tokens"] if usage else len(stamps)
    first = stamps[0] - t0 if stamps else None
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {"ttft": first, "gaps": [b - a for a, b in zip(stamps, stamps[1:])], "tokens": tokens, "text": text,
            "prompt_tokens": usage["prompt_tokens"] if usage else None,
            "tok_s": (tokens - 1) / span if span > 0 else None}


async def _acceptance(http, url: str) -> tuple[float, float]:
    """(sum, count) of the server's acceptance-length histogram; (0, 0) when it has none."""
    try:
        r = await http.get(url + "/metrics")
    except Exception:  # a server without /metrics
        return 0.0, 0.0
    found = {"sum": 0.0, "count": 0.0}
    for line in r.text.splitlines():
        for key in found:
            if line.startswith(f"lucegen_acceptance_length_{key} "):
                found[key] = float(line.split()[1])
    return found["sum"], found["count"]


async def run_level(url: str, model: str, clients: int, requests: int, prompt_tokens: int, gen_tokens: int,
                    turns: int, headers: dict, level_tag: str) -> dict:
    import httpx

    async with httpx.AsyncClient(timeout=600, headers=headers,
                                 limits=httpx.Limits(max_connections=clients + 4)) as http:
        acc0 = await _acceptance(http, url)

        async def client(c: int):
            results = []
            for r in range(requests):
                prompt = prompt_text(f"{level_tag} client {c} request {r}", prompt_tokens)
                body = {"model": model, "prompt": prompt, "max_tokens": gen_tokens, "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}}
                first = await _stream(http, url, body)
                first["turn"] = 1
                results.append(first)
                if turns > 1:
                    second = await _stream(http, url, {**body, "prompt": prompt + first["text"] + " and then?"})
                    second["turn"] = 2
                    results.append(second)
            return results

        t0 = time.perf_counter()
        per_client = await asyncio.gather(*(client(c) for c in range(clients)))
        wall = time.perf_counter() - t0
        acc1 = await _acceptance(http, url)
    done = [r for rs in per_client for r in rs]
    first_turns = [r for r in done if r["turn"] == 1]
    ttft = [r["ttft"] for r in first_turns if r["ttft"] is not None]
    gaps = [g for r in done for g in r["gaps"]]
    rates = [r["tok_s"] for r in done if r["tok_s"] is not None]
    row = {"clients": clients, "requests": len(done), "wall_s": wall,
           "prompt_tokens": percentile([r["prompt_tokens"] for r in first_turns if r["prompt_tokens"]], 0.5),
           "completion_tokens": sum(r["tokens"] for r in done),
           "aggregate_tok_s": sum(r["tokens"] for r in done) / wall if wall > 0 else None,
           "per_stream_tok_s": percentile(rates, 0.5),
           "acceptance_length": (acc1[0] - acc0[0]) / (acc1[1] - acc0[1]) if acc1[1] > acc0[1] else None}
    for name, values in (("ttft_ms", ttft), ("itl_ms", gaps)):
        for q in (50, 95, 99):
            p = percentile(values, q / 100)
            row[f"{name}_p{q}"] = None if p is None else 1e3 * p
    if turns > 1:
        second = [r["ttft"] for r in done if r["turn"] == 2 and r["ttft"] is not None]
        p = percentile(second, 0.5)
        row["turn2_ttft_ms_p50"] = None if p is None else 1e3 * p
    return row


def bench_serve(url: str, model: str | None = None, clients=(1, 4, 8, 16), requests: int = 2,
                prompt_tokens: int = 128, gen_tokens: int = 64, turns: int = 1, api_key: str | None = None) -> dict:
    import httpx

    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if model is None:
        listed = httpx.get(url + "/v1/models", headers=headers, timeout=30).json()
        model = listed["data"][0]["id"]
    rows = []
    for i, n in enumerate(clients):
        rows.append(asyncio.run(run_level(url, model, n, requests, prompt_tokens, gen_tokens, turns, headers,
                                          f"level {i} ({time.time():.0f})")))
    return {"url": url, "model": model, "requests_per_client": requests, "prompt_words": prompt_tokens,
            "gen_tokens": gen_tokens, "turns": turns, "rows": rows}


def format_table(result: dict) -> str:
    def f(value, fmt="{:.1f}"):
        return "-" if value is None else fmt.format(value)

    head = (f"{'clients':>7} {'reqs':>5} {'prompt':>6} {'TTFT p50/p95/p99 ms':>22} {'ITL p50/p95/p99 ms':>20} "
            f"{'stream tok/s':>12} {'total tok/s':>11} {'accept':>6}")
    if result["turns"] > 1:
        head += f" {'turn-2 TTFT ms':>14}"
    lines = [f"bench serve: {result['model']} at {result['url']}, {result['gen_tokens']} tokens per request", head]
    def triple(r, name, fmt):
        return "/".join(f(r[f"{name}_p{q}"], fmt) for q in (50, 95, 99))

    for r in result["rows"]:
        line = (f"{r['clients']:>7} {r['requests']:>5} {f(r['prompt_tokens'], '{:.0f}'):>6} "
                f"{triple(r, 'ttft_ms', '{:.1f}'):>22} {triple(r, 'itl_ms', '{:.2f}'):>20} "
                f"{f(r['per_stream_tok_s']):>12} {f(r['aggregate_tok_s']):>11} "
                f"{f(r['acceptance_length'], '{:.2f}'):>6}")
        if result["turns"] > 1:
            line += f" {f(r.get('turn2_ttft_ms_p50')):>14}"
        lines.append(line)
    return "\n".join(lines)
