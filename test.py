"""Evaluate a checkpoint: ``python test.py checkpoint=PATH [data=...] [data.root=...] [model=...]``.

A thin wrapper of ``python -m addernet.test`` (addernet/test.py); see docs/evaluation.md.
"""

from addernet.test import main

if __name__ == "__main__":
    main()
