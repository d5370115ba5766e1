"""The distinct adder-layer shapes of ResNet-20 (CIFAR, 32x32 input) and ResNet-50 (ImageNet, 224x224).

One table for the CPU and GPU kernel benchmarks and the GPU tests, so they measure and check the same
layers. A row is (name, in_channels, out_channels, input size, kernel, stride, padding).
"""

_TABLE = """
name                          | in   out   size kernel stride padding
r20 16->16 32x32              | 16   16    32   3      1      1
r20 16->32 32x32 s2           | 16   32    32   3      2      1
r20 32->32 16x16              | 32   32    16   3      1      1
r20 32->64 16x16 s2           | 32   64    16   3      2      1
r20 64->64 8x8                | 64   64    8    3      1      1
r20 1x1 16->32 s2             | 16   32    32   1      2      0
r20 1x1 32->64 s2             | 32   64    16   1      2      0
r50 64->64 56x56              | 64   64    56   3      1      1
r50 128->128 28x28            | 128  128   28   3      1      1
r50 256->256 14x14            | 256  256   14   3      1      1
r50 512->512 7x7              | 512  512   7    3      1      1
r50 128->128 56x56 s2         | 128  128   56   3      2      1
r50 1x1 256->64 56x56         | 256  64    56   1      1      0
r50 1x1 64->256 56x56         | 64   256   56   1      1      0
r50 1x1 1024->256 14x14       | 1024 256   14   1      1      0
r50 1x1 512->2048 7x7         | 512  2048  7    1      1      0
r50 1x1 1024->2048 14x14 s2   | 1024 2048  14   1      2      0
"""
ROWS = [
    (name.strip(), *map(int, numbers.split()))
    for name, numbers in (line.split("|") for line in _TABLE.strip().splitlines()[1:])
]
RESNET20 = [row for row in ROWS if row[0].startswith("r20 ")]
RESNET50 = [row for row in ROWS if row[0].startswith("r50 ")]
SHAPES = {row[0]: row for row in ROWS}


def with_batch(names, batch):
    """[(name, batch, in, out, size, kernel, stride, padding)] for the named rows, in the given order."""
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise KeyError(f"unknown layer shape(s) {unknown}; known: {', '.join(SHAPES)}")
    return [(n, batch, *SHAPES[n][1:]) for n in names]
