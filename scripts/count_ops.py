"""Parameters, multiplications, additions and energy of one forward pass of a model.

The command lives in the package: addernet/tools/count_ops.py (also ``python -m addernet.tools.count_ops``).
"""

from addernet.tools.count_ops import cli

if __name__ == "__main__":
    cli()
