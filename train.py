"""Train an AdderNet (or its CNN twin): ``python train.py [experiment=<preset>] [key=value ...]``.

A thin wrapper of ``python -m addernet.train`` (addernet/train.py); see configs/train.yaml and docs/training.md.
"""

from addernet.train import main

if __name__ == "__main__":
    main()
