"""`python -m kvviz COMMAND ...`: the command line (see kvviz/cli/)."""

import sys

from kvviz.cli import main

if __name__ == "__main__":
    sys.exit(main())
