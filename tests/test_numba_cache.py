"""The CPU kernels' on-disk compile cache is keyed on the whole jit package: a kernel that inlines a helper from
another file of kernels/cpu/jit/ recompiles when that helper changes (numba alone would load the stale kernel)."""

import shutil

import pytest

pytest.importorskip("numba")

import kernels.cpu.jit as jit_package  # noqa: E402
from kernels.cpu.jit import decode, pack, step  # noqa: E402


def test_the_stamp_changes_with_any_file_of_the_package(tmp_path):
    folder = tmp_path / "jit"
    shutil.copytree(jit_package._HERE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = jit_package.package_stamp(str(folder))
    assert before == jit_package.package_stamp()
    helper = folder / "fields.py"
    helper.write_text(helper.read_text() + "\n# an edit to a helper that other files inline\n")
    assert jit_package.package_stamp(str(folder)) != before


@pytest.mark.parametrize("fn", [step.step_serial, decode.decode_partials, pack.quant_pack_rows])
def test_every_kernel_is_stamped_with_the_package(fn):
    locator = fn._cache._impl.locator
    assert type(locator).__name__.startswith("PackageStamped")
    assert locator.get_source_stamp() == jit_package.package_stamp()


def test_other_numba_functions_keep_numba_s_own_stamp(tmp_path):
    import numba

    source = tmp_path / "elsewhere.py"
    source.write_text("import numba\n\n@numba.njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("elsewhere", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    locator = module.twice._cache._impl.locator
    assert not type(locator).__name__.startswith("PackageStamped")
    assert isinstance(module.twice, numba.core.registry.CPUDispatcher)
