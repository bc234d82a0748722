"""The launch warm-up (kvviz.ui.common.warm_up): it loads the model and runs the default formats' decode once; the
header says it is warming, then loaded; a model that fails to warm is a message and the app keeps serving."""

from __future__ import annotations

import pytest

from kvviz import quality, runtime
from kvviz.ui import common


def test_warm_up_loads_the_model_and_the_header_follows(monkeypatch, use_runtime):
    use_runtime(KVVIZ_MODEL="tiny-llama")  # a pool of its own
    seen = []
    real_compare = quality.compare

    def compare(*args, **kwargs):  # the header while the warm-up runs
        seen.append(common.header_markdown("tiny-llama"))
        assert common.warming()
        return real_compare(*args, **kwargs)

    monkeypatch.setattr(quality, "compare", compare)
    seconds = common.warm_up("tiny-llama", ["int4", "k8v4"])
    assert seconds > 0 and "warming up in the background" in seen[0]
    assert runtime.current().models.resident() == ["tiny-llama"] and not common.warming()
    assert common.header_markdown("tiny-llama").startswith("**Model** `tiny-llama` (loaded)")


def test_a_model_that_fails_to_warm_is_a_message(use_runtime):
    use_runtime(KVVIZ_MODELS="tiny-no-such-arch")
    with pytest.raises(ValueError, match="Warming up 'tiny-no-such-arch' failed"):
        common.warm_up("tiny-no-such-arch")
    assert "warm-up failed" in common.header_markdown("tiny-no-such-arch") and not common.warming()
    thread = common.start_warm_up("tiny-no-such-arch")  # in the background: logged, nothing raised
    thread.join(timeout=60)
    assert not thread.is_alive()


def test_the_header_never_waits_for_the_cpu_kernels(monkeypatch):
    """Serving the page must not compile: before the fused CPU path has been probed the header says its kernels
    load on first use; once probed, it names the backend."""
    from kvviz import attention

    monkeypatch.setattr(runtime.default(), "backend", "auto")
    monkeypatch.setattr(attention, "_probe", lambda: {"cuda": False, "triton": False, "usable": False})
    attention._cpu_fused.cache_clear()
    assert "fused kernels load on first use" in common.header_markdown()
    assert attention._cpu_fused.cache_info().currsize == 0  # nothing compiled or loaded
    backend = attention.active_backend()  # the first click's probe
    assert common.header_markdown().endswith(f"**attention backend** `{backend}`")


def test_clicks_during_the_kernels_compile_take_the_reference(monkeypatch):
    """While the warm-up compiles the CPU kernels, another thread on the auto backend decodes through torch instead
    of waiting; the warm-up's own thread takes the CPU path."""
    import threading

    from kvviz import attention

    monkeypatch.setattr(runtime.default(), "backend", "auto")
    monkeypatch.setattr(attention, "_probe", lambda: {"cuda": False, "triton": False, "usable": False})
    seen = {}
    inside, release = threading.Event(), threading.Event()

    def warm():
        with attention.compiling_cpu_kernels():
            seen["warm-up"] = attention.active_backend()
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=warm)
    thread.start()
    inside.wait(30)
    seen["click"] = attention.active_backend()
    seen["header"] = attention.settled_backend()
    release.set()
    thread.join()
    assert seen == {"warm-up": "cpu", "click": "torch", "header": None}
    assert attention.active_backend() == "cpu"  # after the block
