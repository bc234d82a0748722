"""kvviz.ui.sensitivity: the Sensitivity tab: which layers carry a KV format's damage, and the cheapest per-layer
plan within a KL budget.

Numbers come from `kvviz.analysis` (layer_sensitivity: the teacher-forced KL when only one layer's K or V is
quantized; layer_norms: the K/V magnitudes that explain its peaks) and `kvviz.analysis.search` (a greedy climb from
the cheapest format, the most sensitive layers first). The text is the prompt or the bundled WikiText-2 slice,
cut to `tokens` tokens. Headers, titles and the summary follow the page's language (the language radio, the last
input: "English" or "한국어" through the API). api_names:
    sensitivity(source, prompt, spec, tokens, model, language)
      -> (K/V x layer heatmap, ranked bars, per-layer norms table, summary markdown)
    plan_search(source, prompt, candidates, custom_candidates, kl_budget, tokens, model, language)
      -> (trade-off figure, plan string, summary markdown (bytes, ratios, engine flags), steps table)
      (a generator: the path's steps stream in passes, kvviz.analysis.search.search_stream; the first pass holds
      the first 8 plans, where the plan found usually is)
The plan's two buttons hand it to the Compare and Memory tabs (`wire_handover`, called by app.py).
"""

from __future__ import annotations

import math

import gradio as gr

from kvviz import memory as mem
from kvviz import models, plots
from kvviz.analysis import layer_norms, layer_sensitivity, ranking
from kvviz.analysis.search import search_stream
from kvviz.analysis.sensitivity import kv_layers, peaks
from kvviz.cache import model_layer_types
from kvviz.export import export_plan
from kvviz.formats import Plan
from kvviz.memory import kv_cache_bytes_for
from kvviz.quality.corpus import wikitext
from kvviz.formats.family import REGISTRY

from .checks import (MAX_PROMPT_CHARS, check_choice, check_float, check_int, check_language, check_spec, check_text,
                     single_specs, spec_list)
from .common import check_model, check_prompt, get_model, model_input, on_click, prompt_input, table, user_errors
from .i18n import Translator, t

TAB = "sensitivity"  # the tab id in app.py; prefixes elem_ids the browser test finds

SOURCES = ("prompt", "WikiText-2")
DEFAULT_CANDIDATES = ["int4", "fp16"]
MAX_CANDIDATES = 4  # each rung below the top costs one batched pass of L rows, and the path grows by L per rung
MIN_TOKENS, MAX_TOKENS, DEFAULT_TOKENS = 16, 512, 256  # on a 2-core CPU, 256 SmolLM2 tokens x 60 rows take minutes
MAX_KL_BUDGET = 10.0  # nats per token: far above any format's damage, a mistyped budget is refused
PLAN_CONTEXT = 4096  # tokens: the context at which the search and the summary count bytes (engine layout)
TOP_BARS = 12
_MIB = 1024 * 1024
_NORM_COLUMNS, _STEP_COLUMNS = 10, 5  # the norms table's and the plan steps table's (i18n sens_col*, plan_col*)


def _text(source, prompt) -> str:
    """The text to measure on: the prompt, or the bundled WikiText-2 slice (the library cuts it to the tokens)."""
    source = check_choice(source, "Text", SOURCES)
    prompt = check_text(prompt, "The prompt", MAX_PROMPT_CHARS)  # checked either way: a wrong type is an error
    return wikitext() if source == "WikiText-2" else check_prompt(prompt)


def _norm_rows(sens: dict, norms: dict) -> list[list]:
    """One row per layer: its K and V KL, then the magnitudes that explain a peak."""
    def r(x: float, digits: int = 3):
        return None if x is None or not math.isfinite(x) else round(x, digits)

    rows = []
    for i in range(len(sens["k"])):
        rows.append([i, r(sens["k"][i], 6), r(sens["v"][i], 6), r(norms["k_max"][i]), r(norms["k_median_amax"][i]),
                     r(norms["k_channel_ratio"][i], 2), r(norms["k_token_norm_max"][i]), r(norms["v_max"][i]),
                     r(norms["v_channel_ratio"][i], 2), r(norms["v_token_norm_max"][i])])
    return rows


def _peaks(sens: dict, norms: dict, lang: str, top: int = 3) -> str:
    """Markdown lines naming the `top` worst (side, layer) pairs, their KL against the median pair's, and the
    layer's channel ratio against the median layer's: the magnitude that explains the peak (or does not)."""
    return "\n".join(t("sens_peak_line", lang).format(
        side=p.side.upper(), layer=p.layer, kl=p.kl, times=p.times_median, ratio=p.channel_ratio,
        median_ratio=p.median_channel_ratio, peak=p.peak) for p in peaks(sens, norms, top))


@user_errors
def run(source, prompt, spec, tokens, model=None, lang="en", progress=gr.Progress()):
    """The per-layer sensitivity map of `spec`, its ranking, and the K/V norms per layer."""
    name = check_model(model)
    text = _text(source, prompt)
    spec = check_spec(spec, "Format")
    tokens = check_int(tokens, "Tokens", MIN_TOKENS, MAX_TOKENS)
    lang = check_language(lang)
    llm, tok = get_model(progress, model=name)

    rows = 2 * len(kv_layers(llm))
    progress(0.1, desc=t("p_sens", lang).format(rows=rows, spec=spec, n=tokens))
    sens = layer_sensitivity(llm, tok, text, spec, max_tokens=tokens)
    progress(0.9, desc=t("p_sens_norms", lang))
    norms = layer_norms(llm, tok, text, max_tokens=tokens)
    where = t("sens_where", lang).format(model=name, spec=sens["spec"], tokens=sens["tokens"])
    heat = plots.sensitivity_heatmap(sens["k"], sens["v"], t("sens_heat_title", lang).format(where=where))
    bars = plots.sensitivity_ranking(ranking(sens), t("sens_rank_title", lang).format(where=where), top=TOP_BARS)
    headers = [t(f"sens_col{i}", lang) for i in range(_NORM_COLUMNS)]
    summary = (t("sens_summary", lang).format(where=where, other=sens["other"], rows=rows, seconds=sens["seconds"])
               + "\n\n" + _peaks(sens, norms, lang))
    return heat, bars, table(_norm_rows(sens, norms), headers), summary


def _move(step, cheapest: str, lang: str) -> str:
    """A search step's move in `lang`: every layer on the cheapest rung (step 0), or which layer rose to which."""
    if step.raised is None:
        return t("plan_move_start", lang).format(spec=cheapest)
    layer, low, high = step.raised
    return t("plan_move", lang).format(layer=layer, low=low, high=high)


def _candidates(chosen, custom) -> list[Plan]:
    names = single_specs(spec_list(chosen, custom, MAX_CANDIDATES, what="Candidate formats"), "Candidate formats",
                         "The search builds plans from candidates such as int4 and fp16.")
    if not names:
        raise ValueError("Pick at least one candidate format (e.g. int4 and fp16): the search mixes them per layer.")
    return names


def _export_line(plan: Plan, layer_types: list[str], model: str, lang: str) -> str:
    """vLLM's flags for the plan (--kv-cache-dtype and --kv-cache-dtype-skip-layers), or why no engine takes it."""
    out = export_plan(plan, len(layer_types), model, layer_types)
    engines = [e for e, r in out.items() if r["supported"]]
    if not engines:
        return t("plan_export_none", lang).format(note=out["vllm"]["note"])
    return "\n".join(f"- {e}: `{out[e]['cli']}`" for e in engines)


@user_errors
def search(source, prompt, candidates, custom_candidates, kl_budget, tokens, model=None, lang="en",
           progress=gr.Progress()):
    """The cheapest per-layer plan within `kl_budget` (kvviz.analysis.search), its trade-off curve and engine
    flags."""
    name = check_model(model)
    text = _text(source, prompt)
    names = _candidates(candidates, custom_candidates)
    budget = check_float(kl_budget, "KL budget (nats/token)", 0.0, MAX_KL_BUDGET)
    tokens = check_int(tokens, "Tokens", MIN_TOKENS, MAX_TOKENS)
    lang = check_language(lang)
    llm, tok = get_model(progress, model=name)
    progress(0.1, desc=t("p_plan", lang).format(cands=", ".join(p.name for p in names), n=tokens))
    for res in search_stream(llm, tok, text, names, budget, max_tokens=tokens, context=PLAN_CONTEXT):
        yield _search_view(res, name, llm, lang)


def _search_view(res, name: str, llm, lang: str) -> tuple:
    """The search's outputs (figure, plan, summary, steps table) from a SearchResult, complete or a pass so far."""
    steps, best, budget = res.steps, res.chosen, res.kl_budget
    uniform = steps[0].bytes  # step 0: every layer on the cheapest rung
    where = t("plan_where", lang).format(model=name, cands=", ".join(res.ladder), budget=budget)
    fig = plots.plan_tradeoff([s.bytes / _MIB for s in steps], [s.kl for s in steps],
                              [s.plan.text for s in steps], budget, best.step,
                              t("plan_fig_title", lang).format(where=where),
                              x_title=t("plan_fig_x", lang).format(context=PLAN_CONTEXT))
    if res.within_budget:
        verdict = t("plan_within", lang).format(budget=budget)
    else:
        verdict = t("plan_over" if res.complete else "plan_not_yet", lang).format(budget=budget, n=len(steps))
    md = t("plan_summary", lang).format(
        where=where, verdict=verdict, plan=best.plan.text, kl=best.kl, mib=best.bytes / _MIB,
        context=PLAN_CONTEXT, fp16=best.bytes / res.bytes_fp16, cheapest=res.ladder[0],
        uniform=best.bytes / uniform, seconds=res.seconds)
    if not res.complete:
        md = t("plan_partial", lang).format(n=len(steps), total=res.path_length) + "\n\n" + md
    md += "\n\n" + t("plan_export", lang) + "\n\n" + _export_line(best.plan, model_layer_types(llm.config), name, lang)
    headers = [t(f"plan_col{i}", lang) for i in range(_STEP_COLUMNS)]
    rows = [[s.step, _move(s, res.ladder[0], lang), s.plan.text, round(s.bytes / _MIB, 3), round(s.kl, 6)]
            for s in steps]
    return fig, best.plan.text, md, table(rows, headers)


# --- handing a plan to the Compare and Memory tabs -------------------------------------------------------------


def _handover_specs(model, plan_text, candidates, custom_candidates) -> tuple[str, str]:
    """(the plan, the uniform cheapest candidate) from the tab's fields, checked: the lines the other tabs get."""
    plan_text = check_text(plan_text, "Plan")
    if not plan_text:
        raise ValueError("Find a plan first: the buttons hand the plan found to the other tab.")
    names = _candidates(candidates, custom_candidates)
    config = get_model(model=check_model(model))[0].config
    cheapest = min(names, key=lambda c: kv_cache_bytes_for(config, PLAN_CONTEXT, k=c, layout="engine"))
    return plan_text, cheapest.name


@user_errors
def to_compare(model, plan_text, candidates, custom_candidates):
    """Open the Compare tab with the plan and the uniform cheapest candidate as its typed formats."""
    plan_text, cheapest = _handover_specs(model, plan_text, candidates, custom_candidates)
    lines = [plan_text] + ([cheapest] if cheapest != plan_text else [])
    return gr.Tabs(selected="compare"), [], "\n".join(lines)


@user_errors
def to_memory(model, plan_text, candidates, custom_candidates):
    """Open the Memory tab on this model's shape (its preset, else custom dimensions) with the plan, fp16 and the
    uniform cheapest candidate."""
    plan_text, cheapest = _handover_specs(model, plan_text, candidates, custom_candidates)
    name = check_model(model)
    lines = [plan_text] + ([cheapest] if cheapest not in (plan_text, "fp16") else [])
    if name in mem.MODEL_PRESETS:
        shape = (name, gr.skip(), gr.skip(), gr.skip())
    else:
        d = models.describe_model(get_model(model=name)[0])
        shape = ("custom", d["layers"], d["kv_heads"], d["head_dim"])
    return (gr.Tabs(selected="memory"), *shape, ["fp16"], "\n".join(lines))


def wire_handover(c: dict, tabs: gr.Tabs, parts: dict) -> None:
    """Connect the plan's buttons to the Compare and Memory tabs' inputs (app.py calls it once all tabs exist)."""
    src = [c["model"], c["plan"], c["candidates"], c["custom_candidates"]]
    cmp, memory = parts["compare"], parts["memory"]
    c["to_compare"].click(to_compare, src, [tabs, cmp["specs"], cmp["custom"]],
                          api_visibility="private", queue=False)
    c["to_memory"].click(to_memory, src,
                         [tabs, memory["model"], memory["layers"], memory["kv_heads"], memory["head_dim"],
                          memory["formats"], memory["custom"]], api_visibility="private", queue=False)


def build(tr: Translator) -> dict:
    """Lay out the Sensitivity tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("sens_intro")), value="sens_intro")
    with gr.Row():
        with gr.Column(scale=3):
            c["model"] = model_input(tr)
            c["source"] = tr(gr.Radio(list(SOURCES), value="WikiText-2", label=t("sens_source"),
                                      info=t("sens_source_info")), label="sens_source", info="sens_source_info")
            c["prompt"] = prompt_input(tr, 1)
        with gr.Column(scale=2, min_width=260):
            c["spec"] = tr(gr.Dropdown(REGISTRY.choices("sensitivity"), value="int4", allow_custom_value=True,
                                       label=t("sens_spec"), elem_id=f"{TAB}-spec"), label="sens_spec")
            c["tokens"] = tr(gr.Slider(MIN_TOKENS, MAX_TOKENS, value=DEFAULT_TOKENS, step=16, label=t("sens_tokens"),
                                       info=t("sens_tokens_info")), label="sens_tokens", info="sens_tokens_info")
            c["run"] = tr(gr.Button(t("sens_run"), variant="primary", elem_id=f"{TAB}-run"), value="sens_run")
    c["summary"] = gr.Markdown(elem_id=f"{TAB}-summary", label="summary")
    with gr.Row():
        c["heat"] = gr.Plot(plots.empty_figure(), label="sensitivity map", show_label=False)
        c["bars"] = gr.Plot(plots.empty_figure(), label="ranking", show_label=False)
    c["norms"] = tr(gr.Dataframe(headers=[t(f"sens_col{i}") for i in range(_NORM_COLUMNS)], label=t("sens_norms"),
                                 wrap=True, elem_id=f"{TAB}-norms"), label="sens_norms",
                    headers=lambda lang: [t(f"sens_col{i}", lang) for i in range(_NORM_COLUMNS)])

    tr(gr.Markdown(t("plan_intro")), value="plan_intro")
    with gr.Row():
        with gr.Column(scale=2, min_width=260):
            c["candidates"] = tr(gr.CheckboxGroup(REGISTRY.choices("candidates"), value=DEFAULT_CANDIDATES,
                                                  label=t("plan_candidates")), label="plan_candidates")
            c["custom_candidates"] = tr(gr.Textbox(label=t("plan_custom"), info=t("plan_custom_info"), lines=1,
                                                   elem_id=f"{TAB}-custom"), label="plan_custom",
                                        info="plan_custom_info")
            c["budget"] = tr(gr.Number(0.01, label=t("plan_budget"), info=t("plan_budget_info"), minimum=0,
                                       elem_id=f"{TAB}-budget"), label="plan_budget", info="plan_budget_info")
            c["search"] = tr(gr.Button(t("plan_run"), variant="primary", elem_id=f"{TAB}-plan-run"),
                             value="plan_run")
            c["plan"] = tr(gr.Textbox(label=t("plan_found"), interactive=False, elem_id=f"{TAB}-plan"),
                           label="plan_found")
            with gr.Row():
                c["to_compare"] = tr(gr.Button(t("plan_to_compare"), size="sm", elem_id=f"{TAB}-to-compare"),
                                     value="plan_to_compare")
                c["to_memory"] = tr(gr.Button(t("plan_to_memory"), size="sm", elem_id=f"{TAB}-to-memory"),
                                    value="plan_to_memory")
        with gr.Column(scale=3):
            c["plan_fig"] = gr.Plot(plots.empty_figure(), label="plan trade-off", show_label=False)
    c["plan_summary"] = gr.Markdown(elem_id=f"{TAB}-plan-summary", label="plan summary")
    c["steps"] = tr(gr.Dataframe(headers=[t(f"plan_col{i}") for i in range(_STEP_COLUMNS)], label=t("plan_steps"),
                                 wrap=True, elem_id=f"{TAB}-steps"), label="plan_steps",
                    headers=lambda lang: [t(f"plan_col{i}", lang) for i in range(_STEP_COLUMNS)])

    lang = tr.language_input()
    c["inputs"] = [c["source"], c["prompt"], c["spec"], c["tokens"], c["model"], lang]
    c["outputs"] = [c["heat"], c["bars"], c["norms"], c["summary"]]
    plan_in = [c["source"], c["prompt"], c["candidates"], c["custom_candidates"], c["budget"], c["tokens"],
               c["model"], lang]
    plan_out = [c["plan_fig"], c["plan"], c["plan_summary"], c["steps"]]
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "model"), "search": (search, plan_in, plan_out, "model")}
    on_click(c["run"], run, c["inputs"], c["outputs"], "sensitivity", progress_on=[c["summary"]])
    on_click(c["search"], search, plan_in, plan_out, "plan_search", progress_on=[c["plan_summary"]])
    return c
