"""kvviz.ui.strings.engines: Compare's engine view (kvviz/ui/engines.py): kvviz against llama.cpp and vLLM, in English
and Korean.
"""

from __future__ import annotations

EN: dict[str, str] = {
    "engine_title": "kvviz against the engines: llama.cpp's (and vLLM's, when configured) cache types measured inside them",
    "engine_intro": ("**What you see:** llama.cpp's own KV cache types run inside llama.cpp (in a worker process of "
                     "the app, on the model's GGUF file) and in kvviz's simulation, on the same tokens of WikiText-2. "
                     "Each side's KLD is taken against its own unquantized run, with llama.cpp's `--kl-divergence` "
                     "statistics."),
    "engine_vllm_note": ("**vLLM too:** this app was started with vLLM servers (KVVIZ_VLLM_URLS), so each run also "
                         "measures vLLM's KV cache dtypes on the same tokens, beside kvviz's simulation of each dtype "
                         "measured the same way (top-20 log-probs, the rest lumped). The verdict column says whether "
                         "the engine's KLD is within 1.5x of the simulation's (*within the format's expected range*) "
                         "or above it (*the engine loses more than the format explains*: the signature of engine "
                         "bugs such as scales never passed to the kernel)."),
    "engine_pairs": "llama.cpp cache types (-ctk / -ctv; a pair is k=K,v=V)",
    "engine_tokens": "Tokens of WikiText-2 (more: slower, steadier figures)",
    "engine_rotate": "Rotate K/V in llama.cpp (Hadamard, its default; kvviz's formats are unrotated)",
    "engine_run": "Run kvviz and llama.cpp",
    "engine_table": ("Mean KLD (nats/token), 99th percentile, and top-token agreement, per format; then kvviz's "
                     "simulation of llama.cpp and its ratio to llama.cpp's mean KLD"),
    "engine_why": (
        "**Why kvviz's bare format differs from llama.cpp** (see docs/engines.md). kvviz's `q4_0` or "
        "`k=q8_0,v=q4_0` stores exactly llama.cpp's blocks, but llama.cpp does more around the storage: *8-bit "
        "matmul inputs:* every quantized weight multiplies its input rounded to 8 bits (q8_1 for the GGUF's Q4_1), "
        "so a small KV error flips some roundings in every later layer; that is q8_0's floor (on SmolLM2 at 512 "
        "tokens kvviz's bare q8_0 reads 0.00026, llama.cpp 0.0034). *Rotation:* unless told not to, llama.cpp "
        "multiplies a quantized K and V by a Hadamard matrix, which lowers q4_0's KLD. *Channel order:* for "
        "Llama-family GGUFs its cache blocks of 32 group other K channels than transformers' order. The column "
        "\"kvviz's llama.cpp simulation\" does all three (and llama.cpp's flash attention) on the same weights and "
        "tokens, with the rotation setting above; it is not bit-exact, so the ratio scatters around 1 (within 20% "
        "on the bundled models at 512 tokens; fewer tokens scatter more)."),
    # the view's results (kvviz/ui/engines.py run): the table, the bars, the status and the progress lines
    "engine_headers": ("format|kvviz mean KLD|kvviz p99 KLD|kvviz same top (%)|engine mean KLD|engine p99 KLD|"
                       "engine same top (%)|kvviz's engine simulation mean KLD|simulation / engine|verdict"),
    "engine_verdict_0": "within the format's expected range",
    "engine_verdict_1": "the engine loses more than the format explains",
    "engine_verdict_2": "the engine loses less than the format explains",
    "engine_vllm_row": "{spec} (vLLM server)",
    "engine_vllm_status": (
        "vLLM ({urls}, baseline {baseline}): top-{k} log-probs per position with the rest lumped, positions 1 to {n}, "
        "beside kvviz's simulation of the same dtypes as vLLM's CPU build stores them (fp8 rounded toward zero: "
        "`vllm:<dtype>/cpu`), estimated the same way on the same tokens; verdict: vLLM's mean KLD within "
        "{tolerance}x of the simulation's, either way."),
    "engine_p_baseline": "llama.cpp: {tokens} tokens through an f16 cache (the baseline)…",
    "engine_p_pair": "llama.cpp: {tokens} tokens through {spec}…",
    "engine_p_kvviz": "kvviz: the same {tokens} tokens, {formats} formats and the exact model as one batch…",
    "engine_p_sim": "kvviz: the same tokens with llama.cpp's arithmetic, {runs} runs…",
    "engine_p_vllm": "vLLM: {tokens} tokens through {servers} servers, and kvviz's simulation of them…",
    "engine_rotated": "llama.cpp (rotated K/V)",
    "engine_unrotated": "llama.cpp (unrotated K/V)",
    "engine_status": (
        "Done in {seconds} s. `{model}`: {engine} runs `{gguf}` as is, f16-cache baseline, positions 0 to {last} "
        "scored, K/V rotation: {rotation}; kvviz runs the same weights dequantized to fp32, exact baseline, "
        "positions 1 to {last}; kvviz's llama.cpp simulation rounds every matmul input to 8 bits and runs "
        "llama.cpp's flash attention{rot} and channel order on the same weights, against itself with an f16 cache, "
        "positions 0 to {last}. The first {tokens} tokens of the WikiText-2 slice. KLD in nats per token; same top: "
        "positions whose top token agrees with the engine's own baseline."),
    "engine_status_rot": ", rotation",
    "engine_s_kvviz": "kvviz (simulated)",
    "engine_s_sim": "kvviz's llama.cpp simulation",
    "engine_s_vllm": "vLLM (CPU build)",
    "engine_bars": "Mean KLD per format: kvviz's simulation beside the engine's own",
}

KO: dict[str, str] = {
    "engine_title": "kvviz와 엔진: llama.cpp(설정하면 vLLM도)의 캐시 타입을 엔진 안에서 측정",
    "engine_intro": ("**보고 있는 것:** llama.cpp의 KV 캐시 타입을 llama.cpp 안에서(앱의 작업자 프로세스에서, 모델의 GGUF 파일로) "
                     "그리고 kvviz의 시뮬레이션으로, WikiText-2의 같은 토큰에 대해 돌린 결과입니다. 각각의 KLD는 자기 "
                     "엔진의 양자화하지 않은 실행과 비교하며, 통계는 llama.cpp의 `--kl-divergence`와 같습니다."),
    "engine_vllm_note": ("**vLLM도:** 이 앱은 vLLM 서버와 함께 시작되었으므로(KVVIZ_VLLM_URLS), 실행할 때마다 같은 "
                         "토큰에서 vLLM의 KV 캐시 dtype도 측정하고, 같은 방식(상위 20개 로그 확률, 나머지는 한 묶음)으로 "
                         "잰 kvviz의 시뮬레이션 옆에 보여 줍니다. 판정 열은 엔진의 KLD가 시뮬레이션의 1.5배 안에 "
                         "있는지(*포맷이 예상하는 범위 안*), 그보다 큰지(*엔진이 포맷으로 설명되는 것보다 더 잃음*: "
                         "스케일이 커널에 전달되지 않는 것 같은 엔진 버그의 특징)를 말합니다."),
    "engine_pairs": "llama.cpp 캐시 타입 (-ctk / -ctv; 쌍은 k=K,v=V)",
    "engine_tokens": "WikiText-2 토큰 수 (많을수록 느리지만 수치가 안정적)",
    "engine_rotate": "llama.cpp에서 K/V 회전 (하다마드, 기본값; kvviz 포맷은 회전하지 않음)",
    "engine_run": "kvviz와 llama.cpp 실행",
    "engine_table": ("포맷별 평균 KLD (nats/토큰), 99번째 백분위수, 최상위 토큰 일치율; 이어서 kvviz의 llama.cpp "
                     "시뮬레이션과 그것의 llama.cpp 평균 KLD에 대한 비율"),
    "engine_why": (
        "**kvviz의 기본 포맷이 llama.cpp와 다른 이유** (docs/engines.md 참고). kvviz의 `q4_0`이나 `k=q8_0,v=q4_0`은 "
        "llama.cpp와 똑같은 블록을 저장하지만, llama.cpp는 저장 말고도 더 하는 일이 있습니다. *8비트 행렬곱 입력:* "
        "양자화된 가중치마다 입력을 8비트로 반올림해 곱하므로(GGUF의 Q4_1에는 q8_1), 작은 KV 오차도 이후 모든 층에서 "
        "반올림 몇 개를 뒤집습니다. 이것이 q8_0의 바닥입니다(SmolLM2, 512 토큰에서 kvviz의 기본 q8_0은 0.00026, "
        "llama.cpp는 0.0034). *회전:* 끄지 않으면 llama.cpp는 양자화된 K와 V에 하다마드 행렬을 곱하고, 그러면 q4_0의 "
        "KLD가 내려갑니다. *채널 순서:* Llama 계열 GGUF에서는 캐시의 32개짜리 블록이 transformers의 순서와 다른 K "
        "채널을 묶습니다. \"kvviz's llama.cpp simulation\" 열은 이 셋(과 llama.cpp의 flash attention)을 같은 가중치와 "
        "토큰에 위의 회전 설정으로 적용합니다. 비트 단위로 같지는 않아서 비율은 1 근처에 흩어집니다(번들 모델, 512 "
        "토큰에서 20% 이내; 토큰이 적으면 더 흩어짐)."),
    "engine_headers": ("포맷|kvviz 평균 KLD|kvviz p99 KLD|kvviz 최상위 일치 (%)|엔진 평균 KLD|엔진 p99 KLD|"
                       "엔진 최상위 일치 (%)|kvviz 엔진 시뮬레이션 평균 KLD|시뮬레이션 / 엔진|판정"),
    "engine_verdict_0": "포맷이 설명하는 범위 안",
    "engine_verdict_1": "엔진이 포맷으로 설명되는 것보다 더 잃음",
    "engine_verdict_2": "엔진이 포맷으로 설명되는 것보다 덜 잃음",
    "engine_vllm_row": "{spec} (vLLM 서버)",
    "engine_vllm_status": (
        "vLLM ({urls}, 기준 {baseline}): 위치마다 상위 {k}개 로그 확률과 나머지를 하나로 묶은 값, 위치 1부터 {n}까지, "
        "vLLM CPU 빌드가 저장하는 방식(fp8을 0 쪽으로 반올림: `vllm:<dtype>/cpu`)으로 같은 dtype을 흉내 낸 kvviz "
        "시뮬레이션을 같은 토큰에서 같은 방법으로 추정해 나란히 둡니다. 판정: vLLM 평균 KLD가 시뮬레이션의 "
        "{tolerance}배 이내(어느 쪽으로든)인지."),
    "engine_p_baseline": "llama.cpp: f16 캐시로 {tokens}개 토큰 (기준)…",
    "engine_p_pair": "llama.cpp: {spec}(으)로 {tokens}개 토큰…",
    "engine_p_kvviz": "kvviz: 같은 {tokens}개 토큰, 포맷 {formats}개와 정확한 모델을 한 배치로…",
    "engine_p_sim": "kvviz: 같은 토큰을 llama.cpp의 산술로, {runs}번 실행…",
    "engine_p_vllm": "vLLM: 서버 {servers}개로 {tokens}개 토큰, 그리고 kvviz의 시뮬레이션…",
    "engine_rotated": "llama.cpp (회전한 K/V)",
    "engine_unrotated": "llama.cpp (회전하지 않은 K/V)",
    "engine_status": (
        "{seconds}초 만에 완료. `{model}`: {engine}이(가) `{gguf}`를 그대로 실행, f16 캐시 기준, 위치 0부터 {last}까지 "
        "채점, K/V 회전: {rotation}; kvviz는 같은 가중치를 fp32로 역양자화해 실행, 정확한 기준, 위치 1부터 "
        "{last}까지; kvviz의 llama.cpp 시뮬레이션은 모든 행렬곱 입력을 8비트로 반올림하고 llama.cpp의 플래시 "
        "어텐션{rot}과 채널 순서를 같은 가중치에서 실행하며, f16 캐시를 쓴 자기 자신과 비교, 위치 0부터 "
        "{last}까지. WikiText-2 발췌의 처음 {tokens}개 토큰. KLD 단위는 토큰당 nats; 최상위 일치: 최상위 토큰이 "
        "엔진 자신의 기준과 같은 위치."),
    "engine_status_rot": ", 회전",
    "engine_s_kvviz": "kvviz (시뮬레이션)",
    "engine_s_sim": "kvviz의 llama.cpp 시뮬레이션",
    "engine_s_vllm": "vLLM (CPU 빌드)",
    "engine_bars": "포맷별 평균 KLD: kvviz 시뮬레이션과 엔진 자체 측정",
}
