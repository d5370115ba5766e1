"""Export to ONNX: ``python scripts/export_onnx.py checkpoint=PATH out=model.onnx [quant.bits=8 ...] [opset=17]``.

The command lives in the package: addernet/tools/export_onnx.py (also ``python -m addernet.tools.export_onnx``).
"""

from addernet.tools.export_onnx import cli

if __name__ == "__main__":
    cli()
