"""Download a published pretrained checkpoint, check its sha256 and write it atomically.

    python -m addernet.zoo fetch resnet20-official [--dest DIR] [--url URL] [--overwrite]

Files too large or too foreign to ship with the package (the official checkpoints) are fetched by
name: the table below pins each to one URL and its full sha256, so a file is used only when it is
byte for byte the published one. ``--url`` fetches the same file from a mirror (``file://`` too).
"""

import argparse
import os
import secrets
import shutil
import urllib.error
import urllib.request

from ..checks import output_folder
from ..errors import CheckpointError, ConfigError, reported
from . import sha256

OFFICIAL_COMMIT = "d94dc43a0f2a7448c8c38bcf638062de89f2d34d"  # huawei-noah/AdderNet, the commit that holds the file
FETCHABLE = {
    "resnet20-official": {
        "file": "ResNet20-AdderNet.pth",
        "url": f"https://github.com/huawei-noah/AdderNet/raw/{OFFICIAL_COMMIT}/models/ResNet20-AdderNet.pth",
        "sha256": "fe3ad7c15573d34cddd9b3ec2eed12d9c2c818e59cd7d0797a954d6f76ea375b",
        "what": "the official AdderNet ResNet-20 for CIFAR-10 (Chen et al.; BSD 3-Clause, Huawei)",
    },
}
CHUNK = 1 << 20


def command(name, dest=None):
    """The shell command that fetches ``name`` (into ``dest``), as error messages quote it."""
    return f"python -m addernet.zoo fetch {name}" + (f" --dest {dest}" if dest else "")


def fetch_hint(path):
    """How to get the checkpoint ``path`` when it is a fetchable file, else ''."""
    base, folder = os.path.basename(os.fspath(path)), os.path.dirname(os.path.abspath(path))
    for name, entry in FETCHABLE.items():
        if entry["file"] == base:
            return f"; it is {entry['what']}: {command(name, folder)} downloads it there"
    return ""


def fetch(name, dest=".", url=None, overwrite=False):
    """``dest``/<file> of the fetchable checkpoint ``name``, downloaded unless a verified copy is there. Another
    file of that name there is replaced only with ``overwrite``; the new file gets the umask's permissions."""
    if name not in FETCHABLE:
        raise CheckpointError(f"no fetchable checkpoint named {name!r}; available: {', '.join(sorted(FETCHABLE))}.")
    entry = FETCHABLE[name]
    url = url or entry["url"]
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise ConfigError(f"--dest {dest} is a file, not a folder; give a folder (it is created when missing).")
    target = os.path.abspath(os.path.join(dest, entry["file"]))
    if os.path.isfile(target):
        got = sha256(target)
        if got == entry["sha256"]:
            return target
        if not overwrite:
            raise ConfigError(
                f"{target} exists and is not the published file (sha256 {got[:16]}..., published "
                f"{entry['sha256'][:16]}...); it is not replaced. Move it, give another --dest, or add --overwrite "
                f"to replace it."
            )
    output_folder(target, "--dest")
    tmp = os.path.join(os.path.dirname(target), f".{entry['file']}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as out:  # created like any file the user writes: the umask decides its permissions
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    shutil.copyfileobj(response, out, CHUNK)
            except (urllib.error.URLError, OSError, ValueError) as e:
                reason = e if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", None) or e
                raise CheckpointError(
                    f"cannot download {name} from {url} ({reason}); on a machine with network access "
                    f"download that URL, copy the file to {target}, and run this command again to check it "
                    f"(or pass --url with a mirror or a file:// path)."
                ) from None
            out.flush()
            os.fsync(out.fileno())
        got = sha256(tmp)
        if got != entry["sha256"]:
            raise CheckpointError(
                f"the file downloaded from {url} has sha256 {got}, not the published {entry['sha256']}; "
                f"it was not saved. Check the URL (a proxy's error page, a different file) and try again."
            )
        os.replace(tmp, target)
    except OSError as e:  # the file itself could not be written: permissions, a full disk
        raise CheckpointError(
            f"cannot write {target} ({e.strerror or e}); give a --dest where it can be written."
        ) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m addernet.zoo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    get = sub.add_parser("fetch", help="download a published checkpoint and check its sha256")
    get.add_argument("name", choices=sorted(FETCHABLE))
    get.add_argument("--dest", default=".", help="folder to write it to (default: the current folder)")
    get.add_argument("--url", help="fetch from this URL instead (a mirror, or file:///path)")
    get.add_argument("--overwrite", action="store_true", help="replace another file of that name in --dest")
    args = parser.parse_args(argv)
    with reported(parser.prog):
        path = fetch(args.name, args.dest, args.url, args.overwrite)
        print(f"{args.name}: {path} (sha256 {FETCHABLE[args.name]['sha256']} verified)")
        print(
            f"evaluate it: python test.py checkpoint={path} model=resnet20 data=cifar10 (data.root=<CIFAR-10 folder>)"
        )
