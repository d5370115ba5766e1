"""``python -m addernet.zoo fetch NAME``: see :mod:`addernet.zoo.fetch`."""

from .fetch import main

if __name__ == "__main__":
    main()
