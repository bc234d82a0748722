"""The long text a position pass reads: the bundled WikiText-2 slice, the user's own text or a text file, cut or
repeated to exactly `context` tokens. A text shorter than the context repeats with a visible marker line between
copies (REPEAT_MARKER), so a reader of the curve knows where the model starts seeing text it has already seen (its
loss falls there: it can copy from the first copy, and a format's damage to that copying shows as KL).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvviz.quality.corpus import wikitext

REPEAT_MARKER = "\n\n= = = The text repeats from here = = =\n\n"


def read_text_file(path) -> str:
    """The text of a UTF-8 file; ValueError for a missing, empty (or whitespace only) or binary file."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"The text file {p} does not exist; give the path of a UTF-8 text file.")
    data = p.read_bytes()
    if b"\x00" in data[:65536]:
        raise ValueError(f"{p} looks binary (it holds NUL bytes); give a UTF-8 text file.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{p} is not UTF-8 text ({err.reason} at byte {err.start}); give a UTF-8 text file.") from None
    if not text.strip():
        raise ValueError(f"{p} is empty; give a file with some text in it (a few pages at least for a long context).")
    return text


def long_text_ids(tokenizer, context: int, text: str | None = None) -> tuple[torch.Tensor, str]:
    """(ids [1, context], note): the first `context` tokens of `text` (None: the bundled WikiText-2 slice), the
    text repeated with REPEAT_MARKER between copies when it is shorter; `note` says so ("" when it did not repeat).
    The marker and each copy are tokenized apart and joined as token ids, so every copy tokenizes as the first."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 2:
        raise ValueError(f"The context is a number of tokens, at least 2; got {context!r}.")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise ValueError("The text is empty; paste some text, or leave it empty to use the WikiText-2 slice.")
    name = "The WikiText-2 slice" if text is None else "The text"
    source = wikitext() if text is None else text
    body = encode(tokenizer, source, special=True)  # the tokenizer's BOS, where it adds one, at the start only
    if body.numel() >= context:
        return body[:context][None], ""
    marker, again = encode(tokenizer, REPEAT_MARKER), encode(tokenizer, source)
    parts, n = [body], body.numel()
    while n < context:
        parts += [marker, again]
        n += marker.numel() + again.numel()
    copies = 1 + -(-(context - body.numel()) // (marker.numel() + again.numel()))
    note = (f"{name} is {body.numel():,} tokens, shorter than the context of {context:,}: it repeats ({copies} "
            f"copies in all), a marker line between copies; past each marker the model can copy from what it read.")
    return torch.cat(parts)[:context][None], note


def encode(tokenizer, text: str, special: bool = False) -> torch.Tensor:
    """Token ids [n] of text; special=False leaves out the tokens a tokenizer adds around a text (Gemma's BOS), for
    pieces joined after the first."""
    return tokenizer(text, return_tensors="pt", add_special_tokens=special)["input_ids"][0]
