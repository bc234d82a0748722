"""kvviz.ui.strings.memory: the Memory tab, in English and Korean."""

from __future__ import annotations

EN: dict[str, str] = {
    "memory_intro": (
        "**What you see:** KV-cache memory against context length for a real model's shape, one line per format, "
        "with dashed lines at what each GPU has left beside the weights. Scale storage is counted: at head_dim 64 "
        "with short groups, it takes a visible bite out of the savings."),
    "model_preset": "Model",
    "memory_config_source": "Or: a config.json, or a hub id (these win over Model)",
    "memory_config_file": "Upload a model's config.json (at most 1 MB)",
    "memory_hf_id": "Hugging Face hub id",
    "memory_hf_id_info": "e.g. Qwen/Qwen3-8B; works only when this app has network access",
    "memory_layout": "Layout",
    "memory_layout_info": ("engine: as vLLM/SGLang allocate (sliding layers hold the window, MLA its latent); "
                           "transformers: as transformers' caches hold it (window - 1); decompressed: MLA per head"),
    "memory_breakdown": "Per layer kind at the longest context: how many layers, the tokens each holds, GB per format",
    "custom_dims": "Custom model dimensions (used when Model is 'custom')",
    "params_b": "Parameters (billions)",
    "gpus": "GPUs (dashed lines, and the table's columns)",
    "batch": "Batch size",
    "ctx_min": "Shortest context (tokens)",
    "ctx_max": "Longest context (tokens)",
    "memory_formats": "Formats",
    "fit_table": ("Per GPU: the longest context that fits at this batch size · the largest batch that fits at the "
                  "longest context above"),
    # the tab's results (kvviz/ui/memory.py run): the chart, the two tables and the formula
    "mem_windowed": "{fmt}: windowed layers",
    "mem_gpu_line": "{gpu} ({gb:g} GB): {kv:.1f} GB for KV",
    "mem_title": "KV cache of {model} at batch {batch} ({layers} layers, {layout} layout)",
    "mem_x": "context length (tokens)",
    "mem_y": "KV cache memory (GB)",
    "mem_any": "any",
    "mem_fit_cell": "{tokens} tokens · batch {batch}",
    "mem_fit_headers": "format|bits/value (K / V)|GB at {tokens} tokens × {batch}|tokens vs fp16",
    "mem_breakdown_headers": "layer kind|layers|tokens each at {tokens}|K heads × dim|V heads × dim",
    "mem_window": " (window {window})",
    "mem_formula": (
        "**bytes = Σ over layers: (K heads × K dim + V heads × V dim) × batch × tokens held × bits per value ÷ 8** "
        "(+ per-layer static scales; bits per value include per-group scales and zero points; tokens held: the "
        "context for full attention, the window for sliding and chunked layers; {layout} layout)"),
    "mem_engine_16bit": " (the engine keeps some layers in 16 bits)",
    "mem_per_layer": ("- `{fmt}`: each layer in its own format{own}, summed over {layers} layers × {batch} = "
                      "**{gb} GB** ({bytes} bytes)"),
    "mem_bytes": "({bytes} bytes)",
    "mem_state": "Recurrent layers' fixed state: {mb} MB at batch {batch} (does not grow).",
    "mem_no_params": "Give the parameter count (Parameters, billions) to see what fits on each GPU.",
    "mem_weights_too_big": "The weights alone ({gb} GB in bf16) do not fit on: {gpus}.",
}

KO: dict[str, str] = {
    "memory_intro": (
        "**보고 있는 것:** 실제 모델 형태에서 문맥 길이에 따른 KV 캐시 메모리, 포맷마다 선 하나, 그리고 가중치를 뺀 뒤 각 "
        "GPU에 남는 용량을 점선으로 보여줍니다. 스케일 저장도 계산에 넣습니다: head_dim 64에 그룹이 짧으면 절감분이 "
        "눈에 띄게 줄어듭니다."),
    "model_preset": "모델",
    "memory_config_source": "또는: config.json 파일이나 허브 id (모델 선택보다 우선)",
    "memory_config_file": "모델의 config.json 올리기 (최대 1 MB)",
    "memory_hf_id": "Hugging Face 허브 id",
    "memory_hf_id_info": "예: Qwen/Qwen3-8B; 이 앱이 네트워크에 연결되어 있을 때만 동작",
    "memory_layout": "레이아웃",
    "memory_layout_info": ("engine: vLLM/SGLang이 할당하는 방식 (슬라이딩 레이어는 윈도만, MLA는 잠재 벡터만); "
                           "transformers: transformers 캐시 방식 (윈도 - 1); decompressed: MLA를 헤드별로"),
    "memory_breakdown": "최장 문맥에서 레이어 종류별: 레이어 수, 각 레이어가 담는 토큰 수, 포맷별 GB",
    "custom_dims": "직접 입력한 모델 크기 (모델이 'custom'일 때 사용)",
    "params_b": "파라미터 수 (십억)",
    "gpus": "GPU (점선, 그리고 표의 열)",
    "batch": "배치 크기",
    "ctx_min": "가장 짧은 문맥 (토큰)",
    "ctx_max": "가장 긴 문맥 (토큰)",
    "memory_formats": "포맷",
    "fit_table": "GPU별: 현재 배치 크기에서 들어가는 최장 문맥 · 위의 최장 문맥에서 들어가는 최대 배치",
    "mem_windowed": "{fmt}: 윈도 레이어",
    "mem_gpu_line": "{gpu} ({gb:g} GB): KV에 {kv:.1f} GB",
    "mem_title": "{model}의 KV 캐시, 배치 {batch} (레이어 {layers}개, {layout} 레이아웃)",
    "mem_x": "문맥 길이 (토큰)",
    "mem_y": "KV 캐시 메모리 (GB)",
    "mem_any": "제한 없음",
    "mem_fit_cell": "{tokens} 토큰 · 배치 {batch}",
    "mem_fit_headers": "포맷|값당 비트 (K / V)|{tokens} 토큰 × {batch}에서 GB|fp16 대비 토큰 수",
    "mem_breakdown_headers": "레이어 종류|레이어 수|{tokens}에서 레이어마다 담는 토큰|K 헤드 × 차원|V 헤드 × 차원",
    "mem_window": " (윈도 {window})",
    "mem_formula": (
        "**바이트 = 모든 레이어의 합: (K 헤드 × K 차원 + V 헤드 × V 차원) × 배치 × 담는 토큰 × 값당 비트 ÷ 8** "
        "(+ 레이어별 정적 스케일; 값당 비트에는 그룹별 스케일과 영점이 들어 있음; 담는 토큰: 전체 어텐션은 문맥 전체, "
        "슬라이딩·청크 레이어는 윈도; {layout} 레이아웃)"),
    "mem_engine_16bit": " (엔진이 일부 레이어를 16비트로 둠)",
    "mem_per_layer": ("- `{fmt}`: 레이어마다 자기 포맷{own}, 레이어 {layers}개 × {batch}의 합 = **{gb} GB** "
                      "({bytes} 바이트)"),
    "mem_bytes": "({bytes} 바이트)",
    "mem_state": "순환 레이어의 고정 상태: 배치 {batch}에서 {mb} MB (늘어나지 않음).",
    "mem_no_params": "GPU마다 무엇이 들어가는지 보려면 파라미터 수(십억)를 입력하세요.",
    "mem_weights_too_big": "가중치만으로도 ({gb} GB, bf16) 이 GPU에 들어가지 않습니다: {gpus}.",
}
