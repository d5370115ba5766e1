"""Fetching a published checkpoint: downloaded over a loopback server (never the internet), checked against its
sha256, written atomically, and named by the error a missing official checkpoint gives."""

import functools
import hashlib
import http.server
import os
import re
import threading

import pytest

from addernet.checkpoint import load_checkpoint
from addernet.errors import CheckpointError
from addernet.zoo import fetch as zf

from helpers import OFFICIAL_R20, needs_shared


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
    (folder / "demo.pth").write_bytes(fake_entry[:-1] + b"x")
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
