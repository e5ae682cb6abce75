"""200 malformed or hostile requests against a real server on the CPU engine: valid bodies with one field
replaced by a hypothesis-drawn hostile value (huge and negative numbers, NaN and infinities, wrong types, unicode
edge cases, deep nesting), whole random JSON documents, and raw bytes. Each is answered with a 4xx error object
(or, where the mutation happens to be valid, a 200), never a 500; /health still answers afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lucegen import LLM
from serve_helpers import TEMPLATE, ServerThread, write_tiny

BASES = {
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                             "temperature": 0.5, "top_p": 0.9, "seed": 1, "stop": ["x"], "stream": False,
                             "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                                 "type": "object", "properties": {"a": {"type": "string"}}}}}],
                             "chat_template_kwargs": {"enable_thinking": False}},
    "/v1/completions": {"model": "tiny", "prompt": "hello", "max_tokens": 2, "temperature": 0.7, "top_k": 5,
                        "min_p": 0.1, "seed": 3, "stop": "zz", "stream": False},
    "/v1/messages": {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}]}], "system": "be brief", "temperature": 0.3,
        "thinking": {"type": "enabled", "budget_tokens": 4}, "stop_sequences": ["q"]},
}

UNICODE = st.sampled_from(["\ud800", "\udfff", "\x00", "\u202e", "\ufeff", "\U0010ffff", "e\u0301", "🙂" * 50,
                           "<tool_call>", "</think>", "<|im_end|>", "\\", '"', ""])
HOSTILE = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70), st.sampled_from([2**64, -1, 0, 10**30, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(), UNICODE,
    st.text(max_size=20), st.lists(st.integers(), max_size=4), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                                max_size=3),
    st.integers(min_value=1, max_value=400).map(lambda depth: json.loads("[" * depth + "]" * depth)),
)
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
                           lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=12)


def paths(value, prefix=()):
    """Every (key path) inside a JSON value, containers included."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


def replaced(value, path, new):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


@st.composite
def hostile_request(draw):
    endpoint = draw(st.sampled_from(sorted(BASES)))
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "drop", "document", "bytes"]))
    base = BASES[endpoint]
    if kind == "mutate":
        path = draw(st.sampled_from(list(paths(base))[1:]))
        body = json.dumps(replaced(base, path, draw(HOSTILE))).encode()
    elif kind == "drop":
        key = draw(st.sampled_from(sorted(base)))
        body = json.dumps({k: v for k, v in base.items() if k != key}).encode()
    elif kind == "document":
        body = json.dumps(draw(JSON_VALUES)).encode()
    else:
        body = draw(st.binary(max_size=64))
    return endpoint, body


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    llm = LLM(write_tiny(tmp_path_factory.mktemp("serve") / "tiny"), device="cpu", max_context=512,
              chat_template=TEMPLATE)
    srv = ServerThread(llm, slots=2)
    yield srv
    srv.stop()


def test_hostile_requests_get_4xx(server):
    seen = {}

    @settings(max_examples=200, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(hostile_request())
    def one(request):
        endpoint, body = request
        r = httpx.post(server.url + endpoint, content=body, timeout=30,
                       headers={"content-type": "application/json"})
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code == 200 or 400 <= r.status_code < 500, (endpoint, body[:300], r.status_code, r.text)
        if r.status_code != 200:
            error = r.json()["error"]
            assert error["message"] and "Traceback" not in r.text

    one()
    print(f"\nstatuses of the hostile requests: {dict(sorted(seen.items()))}")
    assert sum(n for code, n in seen.items() if code >= 400) >= 100
    assert server.get("/health").json()["status"] == "ok"
