import sys

from bertlint.lsp import main

if __name__ == "__main__":
    sys.exit(main())
