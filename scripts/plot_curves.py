"""Plot train/val top-1 and loss per epoch of run dirs: ``python scripts/plot_curves.py RUN_DIR [...] [--log]``.

The command lives in the package (addernet/analysis/curves.py, also ``python -m addernet.analysis.curves``).
"""

from addernet.analysis.curves import main
from addernet.errors import reported

if __name__ == "__main__":
    with reported("plot_curves.py"):
        main()
