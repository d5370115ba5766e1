"""Fetching a published checkpoint: downloaded over a loopback server (never the internet), checked against its
sha256, written atomically, and named by the error a missing official checkpoint gives."""

import functools
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import threading

import pytest

from addernet.checkpoint import load_checkpoint
from addernet.errors import CheckpointError
from addernet.zoo import fetch as zf

from helpers import OFFICIAL_R20, REPO, needs_shared


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path):
    """(URL prefix, folder) of a loopback HTTP server serving ``folder``."""
    folder = tmp_path / "served"
    folder.mkdir()
    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder
    server.shutdown()
    server.server_close()


@pytest.fixture
def fake_entry(monkeypatch):
    """A fetchable entry 'demo' whose published bytes are ``payload``."""
    payload = os.urandom(3 * zf.CHUNK // 2)  # more than one chunk
    entry = {"file": "demo.pth", "url": "unused", "sha256": hashlib.sha256(payload).hexdigest(), "what": "a demo"}
    monkeypatch.setitem(zf.FETCHABLE, "demo", entry)
    return payload


def test_fetch_downloads_checks_and_keeps_a_verified_copy(served, fake_entry, tmp_path):
    url, folder = served
    (folder / "demo.pth").write_bytes(fake_entry)
    dest = tmp_path / "models"
    path = zf.fetch("demo", dest, url=f"{url}/demo.pth")
    assert path == str(dest / "demo.pth") and (dest / "demo.pth").read_bytes() == fake_entry
    assert os.listdir(dest) == ["demo.pth"]  # no temporary left
    (folder / "demo.pth").unlink()  # a verified copy is not downloaded again
    assert zf.fetch("demo", dest, url=f"{url}/demo.pth") == path


def test_a_file_with_another_hash_is_refused_and_not_saved(served, fake_entry, tmp_path):
    url, folder = served
    (folder / "demo.pth").write_bytes(fake_entry[:-1] + bytes([fake_entry[-1] ^ 1]))  # last byte differs
    dest = tmp_path / "models"
    with pytest.raises(CheckpointError, match=f"not the published {zf.FETCHABLE['demo']['sha256']}"):
        zf.fetch("demo", dest, url=f"{url}/demo.pth")
    assert os.listdir(dest) == []


def test_an_unreachable_url_says_what_failed_and_where_the_file_goes(served, fake_entry, tmp_path, capsys):
    url, _ = served
    with pytest.raises(SystemExit) as e:
        zf.main(["fetch", "demo", "--dest", str(tmp_path / "models"), "--url", f"{url}/missing.pth"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert f"{url}/missing.pth (HTTP Error 404" in err and str(tmp_path / "models" / "demo.pth") in err
    assert os.listdir(tmp_path / "models") == []


@needs_shared("official/ResNet20-AdderNet.pth")
def test_the_missing_official_checkpoint_names_the_command_that_gets_it(tmp_path, capsys):
    missing = tmp_path / "models" / "ResNet20-AdderNet.pth"
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(missing)
    cmd = re.search(r"python -m addernet\.zoo (fetch \S+ --dest \S+)", str(e.value))
    assert cmd, str(e.value)
    # the named command, fetching from a local mirror of the published file, puts it where it was looked for
    zf.main(cmd.group(1).split() + ["--url", OFFICIAL_R20.as_uri()])
    assert str(missing) in capsys.readouterr().out
    assert zf.FETCHABLE["resnet20-official"]["sha256"] == hashlib.sha256(OFFICIAL_R20.read_bytes()).hexdigest()
    assert len(load_checkpoint(missing)) == 132  # the official state_dict's tensors


def test_unknown_name_lists_the_fetchable_ones():
    with pytest.raises(CheckpointError, match="resnet20-official"):
        zf.fetch("resnet20", ".")


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_the_fetched_file_gets_the_umasks_permissions(served, fake_entry, tmp_path, umask):
    url, folder = served
    (folder / "demo.pth").write_bytes(fake_entry)
    old = os.umask(umask)
    try:
        path = zf.fetch("demo", tmp_path / "models", url=f"{url}/demo.pth")
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


def test_another_file_of_that_name_is_replaced_only_with_overwrite(served, fake_entry, tmp_path, capsys):
    url, folder = served
    (folder / "demo.pth").write_bytes(fake_entry)
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "demo.pth").write_bytes(b"the user's fine-tuned weights")
    argv = ["fetch", "demo", "--dest", str(dest), "--url", f"{url}/demo.pth"]
    with pytest.raises(SystemExit) as e:
        zf.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert f"{dest / 'demo.pth'} exists and is not the published file" in err and "--overwrite" in err
    assert (dest / "demo.pth").read_bytes() == b"the user's fine-tuned weights" and os.listdir(dest) == ["demo.pth"]
    zf.main([*argv, "--overwrite"])
    assert (dest / "demo.pth").read_bytes() == fake_entry


def test_the_readme_fetches_into_a_folder_git_ignores():
    [dest] = re.findall(r"python -m addernet\.zoo fetch \S+ --dest (\S+)", (REPO / "README.md").read_text())
    file = f"{dest}/{zf.FETCHABLE['resnet20-official']['file']}"
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout")
    r = subprocess.run(["git", "check-ignore", "-q", "--no-index", file], cwd=REPO)
    assert r.returncode == 0, f"{file} is not covered by .gitignore"


@pytest.mark.parametrize("where", ["a file", "below a file", "read-only"])
def test_a_dest_that_cannot_take_the_file_is_one_line(served, fake_entry, tmp_path, capsys, where):
    url, folder = served
    (folder / "demo.pth").write_bytes(fake_entry)
    (tmp_path / "file").write_text("x")
    dest = {"a file": tmp_path / "file", "below a file": tmp_path / "file" / "models", "read-only": "/sys/models"}
    if where == "read-only" and not os.path.isdir("/sys/kernel"):
        pytest.skip("/sys (a file system no one may create folders in) is Linux's")
    with pytest.raises(SystemExit) as e:
        zf.main(["fetch", "demo", "--dest", str(dest[where]), "--url", f"{url}/demo.pth"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("python -m addernet.zoo: error:")
    assert ("is a file, not a folder" if where == "a file" else "cannot create its folder") in err, err
    assert (tmp_path / "file").read_text() == "x"
