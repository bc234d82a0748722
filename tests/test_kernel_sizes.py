"""docs/DESIGN.md's file-size rule for the kernels: no file under kernels/ is over 400 lines (a file that grows past
it is split by concern, as kernels/cpu/meta.py came out of kernels/cpu/decode.py and kernels/cpu/jit/unpack.py out of
kernels/cpu/jit/flat.py)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 400


def test_no_kernel_file_is_over_400_lines():
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for path in sorted((ROOT / "kernels").rglob("*.py"))}
    assert len(sizes) > 20, f"kernels/ holds only {len(sizes)} Python files: was it moved?"
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"kernel files over {MAX_LINES} lines (split them by concern): {over}"


def test_the_design_states_the_rule():
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    assert re.search(r"no Python file there is over\s+400 lines", design), "docs/DESIGN.md no longer states the rule"
