"""pytest fixtures shared by the test modules (plain helpers are in helpers.py)."""
import pytest

from helpers import write_jpeg_folder


@pytest.fixture
def jpeg_cifar(tmp_path_factory):
    """A small cifar10_folder tree: train/ (4 classes x 12 JPEGs) and test/ (37 JPEGs: an odd count)."""
    root = tmp_path_factory.mktemp("jpeg_cifar")
    write_jpeg_folder(root / "train", 12, seed=1)
    write_jpeg_folder(root / "test", 9, seed=2)
    (root / "test" / "automobile" / "extra.jpg").write_bytes((root / "test" / "airplane" / "0.jpg").read_bytes())
    return root
