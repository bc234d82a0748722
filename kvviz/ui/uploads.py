"""kvviz.ui.uploads: file inputs of named endpoints: a gr.File whose payload the endpoint's own check reads."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from .checks import check_upload


def UploadFile(*args, **kwargs) -> gr.File:  # noqa: N802 (a component constructor, spelled like one)
    """A gr.File whose payload reaches the callback unvalidated, for a named endpoint with preprocess=False;
    read it with `upload_path`. Arguments as gr.File's.

    gradio checks a File payload against its FileData model before any callback runs, outside preprocess, so a
    number or a bare string sent to the API would fail there with gradio's generic "has not enabled verbose
    error reporting". Without the model, kvviz.ui.checks.check_upload checks it and names what is wrong. gradio
    still moves FileData payloads into its cache (and refuses paths outside its allowed folders) before that.
    A factory, not a subclass: gradio writes a .pyi stub beside any module that subclasses a component.
    """
    box = gr.File(*args, **kwargs)
    box.api_info()  # cache the FileData schema, so gradio_client still sees a file parameter
    box.data_model = None
    return box


def upload_path(value, what: str):
    """The local path of a file uploaded through an UploadFile (ValueError for anything else)."""
    from gradio.utils import get_upload_folder

    return check_upload(value, what, Path(get_upload_folder()))
