"""``python -m onnxep.cli``, the command line's old address, kept working (the CLI lives in
onnxep.tools.cli; the ``onnxep`` console script points there)."""

from __future__ import annotations

import sys

from .tools.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
