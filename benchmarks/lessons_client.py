"""Lessons as an API caller runs them: each lesson's actions sent through gradio_client to app.py on each bundled
model, in English and Korean, with the arguments its button sends (kvviz.ui.lessons.calls), each action to the
endpoint its tab's own button calls (the page built in this process finds it by the action's inputs and outputs).

    python benchmarks/lessons_client.py --lessons 10,11                    # both bundled models, both languages
    python benchmarks/lessons_client.py --lessons 11 --models gemma-3-270m --langs ko

Without --url it starts `python app.py` on each model (tests/app_server.py). Each call prints its seconds (the
whole streamed call, as the client waits for its last update) and the first line of what the call says in its
status (the first text output that holds the language's done word); an error from the app, or a status that is not
done in the call's language, stops the run with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MODELS = ("smollm2-135m", "gemma-3-270m")
LANGS = {"en": ("English", "Done in"), "ko": ("한국어", "완료")}  # the radio's choice, the done status's words


def endpoints(demo) -> dict:
    """{(input ids, output ids): api_name} of the page's public endpoints."""
    out = {}
    for f in demo.fns.values():
        if f.api_name and getattr(f, "api_visibility", "public") == "public":
            out[(tuple(c._id for c in f.inputs), tuple(c._id for c in f.outputs))] = f.api_name
    return out


def _is_language(component) -> bool:
    """Whether `component` is the page's language radio (the last input of every action)."""
    from kvviz.ui.i18n import LANGUAGES

    choices = [c[0] if isinstance(c, (list, tuple)) else c for c in getattr(component, "choices", None) or ()]
    return set(LANGUAGES) <= set(choices)


def _texts(result) -> list[str]:
    items = result if isinstance(result, (list, tuple)) else [result]
    return [x for x in items if isinstance(x, str)]


def main() -> int:
    import app
    from gradio_client import Client

    from app_server import serve_app
    from kvviz.ui import lessons

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lessons", required=True, help="comma list of lesson numbers, e.g. 10,11")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--langs", default="en,ko")
    p.add_argument("--url", help="an app already running (one model: --models names it)")
    args = p.parse_args()
    numbers = [int(x) for x in args.lessons.split(",")]
    bad = [i for i in numbers if not 1 <= i <= len(lessons.LESSONS)]
    if bad:
        p.error(f"no lesson {bad}: there are 1 to {len(lessons.LESSONS)}")
    demo = app.build_demo()
    apis = endpoints(demo)
    failed = 0
    for model in args.models.split(","):
        with serve_app(model=model) if not args.url else contextlib.nullcontext(SimpleNamespace(url=args.url)) as srv:
            client = Client(srv.url, verbose=False)
            for i in numbers:
                tab = demo.parts[lessons.LESSONS[i - 1].tab]
                for lang in args.langs.split(","):
                    choice, done = LANGS[lang]
                    for action, _, call_args in lessons.calls(demo.parts, i, model):
                        _, inputs, outputs, _ = tab["actions"][action]
                        api = apis[(tuple(c._id for c in inputs), tuple(c._id for c in outputs))]
                        call_args = [choice if _is_language(c) else a for c, a in zip(inputs, call_args)]
                        start = time.perf_counter()
                        try:
                            result = client.predict(*call_args, api_name=f"/{api}")
                        except Exception as e:  # the app's message, as the caller gets it
                            print(f"{model} lesson {i} {lang} /{api}: ERROR {e}", flush=True)
                            failed += 1
                            continue
                        seconds = time.perf_counter() - start
                        status = next((s for s in _texts(result) if done in s), None)
                        if status is None:
                            failed += 1
                        line = status.strip().splitlines()[0] if status else "no status says done"
                        print(f"{model} lesson {i} {lang} /{api}: {seconds:.1f} s | {line[:150]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
