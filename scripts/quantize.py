"""Write a quantised checkpoint: ``python scripts/quantize.py checkpoint=PATH out=PATH quant.bits=8 [quant.*=...]``.

The command lives in the package: addernet/tools/quantize.py (also ``python -m addernet.tools.quantize``).
"""

from addernet.tools.quantize import cli

if __name__ == "__main__":
    cli()
