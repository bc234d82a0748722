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
}
