"""Results and throughput tables of run dirs: ``python scripts/summarize_runs.py SWEEP_OR_RUN_DIR [...]``.

The command lives in the package (addernet/analysis/summarize.py, also
``python -m addernet.analysis.summarize``); its options: ``--help``.
"""

import sys

from addernet.analysis.summarize import main

if __name__ == "__main__":
    sys.exit(main())
