"""The sm_90 SASS of the Triton tiles, compiled offline: ``python scripts/triton_sass_report.py [--arch 90] ...``.

The command lives in the package: addernet/tools/triton_sass_report.py (also
``python -m addernet.tools.triton_sass_report``); it needs triton.
"""

from addernet.errors import reported
from addernet.tools.triton_sass_report import main

if __name__ == "__main__":
    with reported("triton_sass_report.py"):
        main()
