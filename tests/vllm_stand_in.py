"""A stand-in for `python -m vllm.entrypoints.openai.api_server`, for tests/test_engines_vllm_local.py: it takes
vLLM's arguments, listens on 127.0.0.1:--port and answers GET /v1/models, POST /tokenize and POST /v1/completions
with vLLM's recorded answers (tests/data/; the fp8_e4m3 server's for any --kv-cache-dtype but auto), so
kvviz.engines.vllm_local runs end to end in seconds without vLLM."""

from __future__ import annotations

import argparse
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path(__file__).parent / "data"


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-m")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--kv-cache-dtype", default="auto")
    args, _ = p.parse_known_args(argv)
    completions = "vllm_completions_baseline.json" if args.kv_cache_dtype == "auto" else \
        "vllm_completions_fp8_e4m3.json"
    routes = {"/v1/models": "vllm_models.json", "/tokenize": "vllm_tokenize.json", "/v1/completions": completions}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            if self.command == "POST":
                self.rfile.read(int(self.headers["Content-Length"]))
            name = routes.get(self.path)
            raw = (DATA / name).read_bytes() if name else b'{"detail": "Not Found"}'
            self.send_response(200 if name else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = _answer

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
