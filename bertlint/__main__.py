"""``python -m bertlint`` = the ``bertlint`` command."""

import sys

from bertlint.cli import main

if __name__ == "__main__":
    sys.exit(main())
