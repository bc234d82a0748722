"""kvviz app: the Gradio playground for KV-cache quantization.

Placeholder page until the tabs land: `build_demo()` returns a `gr.Blocks` with no side effects at import.

Run: `make run` (or `python app.py`) serves http://127.0.0.1:7860; GRADIO_SERVER_NAME and GRADIO_SERVER_PORT
override the address (the Dockerfile sets GRADIO_SERVER_NAME=0.0.0.0).
"""

import os

import gradio as gr


def build_demo() -> gr.Blocks:
    """Build the kvviz page: a title and a one-paragraph introduction."""
    with gr.Blocks(title="kvviz: KV-cache quantization playground") as demo:
        gr.Markdown(
            "# kvviz: KV-cache quantization playground\n"
            "See what quantizing a language model's KV cache does to memory, to the keys and values themselves, "
            "and to the text the model writes."
        )
    return demo


if __name__ == "__main__":
    build_demo().launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
    )
