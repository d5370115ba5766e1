"""Convert an official AdderNet checkpoint (huawei-noah/AdderNet) into this repo's checkpoint format.

The command lives in the package: addernet/tools/convert_official.py
(also ``python -m addernet.tools.convert_official``).
"""

from addernet.tools.convert_official import main

if __name__ == "__main__":
    main()
