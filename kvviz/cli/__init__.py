"""kvviz's command line: `python -m kvviz COMMAND ...` (`python -m kvviz --help` lists the commands), one module per
command: memory, bench, engines, kld, sensitivity, plan, drift (common.py: what sensitivity and plan share).

    python -m kvviz memory --model llama-3.1-70b --context 32768 --formats fp16,fp8,k8v4,mxfp4 --gpu h100-80gb
    python -m kvviz memory --config path/to/config.json --context 131072 --gpu h200 --params 27.4

Adding a command: write kvviz/cli/NAME.py with `HELP` (one line), `add_arguments(parser)` (its arguments) and
`run(args) -> int` (its work), and add the module to `COMMANDS`. A bad argument, or a ValueError from the library,
ends in one line on stderr and exit status 2; nothing else is caught, so a bug still shows its traceback.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

from kvviz.cli import bench, drift, engines, kld, memory, plan, sensitivity


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `kvviz memory: error: ... (see --help)`, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one-line help, argument setup and the function that runs it (-> exit status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: list[Command] = [
    Command(module.__name__.rsplit(".", 1)[1], module.HELP, module.add_arguments, module.run)
    for module in (memory, bench, engines, kld, sensitivity, plan, drift)
]


def build_parser() -> argparse.ArgumentParser:
    """The `kvviz` argument parser with one subparser per entry of COMMANDS."""
    parser = _Parser(prog="kvviz", description="kvviz: a KV-cache quantization playground.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default sys.argv[1:]), run the command, return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args._run(args)
    except ValueError as err:  # the library's user-facing errors: one line, no traceback
        print(f"kvviz {args.command}: error: {err}", file=sys.stderr)
        return 2
