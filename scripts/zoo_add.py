"""Add a finished run to the model zoo: ``python scripts/zoo_add.py RUN_DIR NAME --preset P --command C --data-root D``.

The command lives in the package (addernet/tools/zoo_add.py, also ``python -m addernet.tools.zoo_add``);
its options and checks: ``--help`` and docs/reliability.md.
"""

from addernet.errors import reported
from addernet.tools.zoo_add import main

if __name__ == "__main__":
    with reported("zoo_add.py"):
        main()
