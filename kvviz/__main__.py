"""`python -m kvviz COMMAND ...`: the command line (see kvviz/cli.py)."""

import sys

from kvviz.cli import main

if __name__ == "__main__":
    sys.exit(main())
