"""Compile every registered kernel signature for this GPU into the cubin cache; the same as
``python -m baracuda_numba.precompile [-j N] [--only scan,reduce] [--dtypes bf16,f32]``
(kept for the scripts and notes that name this path).
"""

from __future__ import annotations

import sys

from baracuda_numba.precompile import main

if __name__ == "__main__":
    sys.exit(main())
