"""simdist.files: atomic writes (all or nothing, no temporary files, umask modes), one-line reasons, bounded reads."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from simdist import files
from simdist.errors import OutputError, SimdistNote, SpecError
from simdist.limits import INPUT_BYTES, Limit

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


def test_write_creates_parents_and_replaces_atomically(tmp_path):
    target = tmp_path / "a" / "b" / "report.html"
    assert files.write_text(target, "one") == target
    assert target.read_text() == "one"
    files.write_text(target, "two")
    assert target.read_text() == "two" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_get_the_umask_mode(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        files.write_text(tmp_path / "x.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == mode  # mkstemp alone would give 0600


def test_a_folder_in_the_way_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "report.html").mkdir()
    with pytest.raises(OutputError, match=r"report.html: it is a folder") as info:
        files.write_text(tmp_path / "report.html", "x", field="--html")
    assert "\n" not in str(info.value) and str(info.value).startswith("--html: ")
    assert _leftovers(tmp_path) == []


def test_other_kinds_in_the_way(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="exists as a FIFO"):
        files.write_text(fifo, "x")
    (tmp_path / "plain").write_text("")
    with pytest.raises(OutputError, match=r"plain is a file, not a folder"):
        files.write_text(tmp_path / "plain" / "sub" / "x.html", "x")
    with pytest.raises(OutputError, match="names a folder"):
        files.write_text(tmp_path / "..", "x")
    with pytest.raises(OutputError, match="NUL byte"):
        files.write_text(tmp_path / "a\0b", "x")


@pytest.mark.skipif(ROOT, reason="root writes into read-only folders")
def test_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="is not writable"):
            files.write_text(ro / "x.html", "x")
        with pytest.raises(OutputError, match="is not writable"):
            files.write_text(ro / "new" / "x.html", "x")
    finally:
        ro.chmod(0o755)


def test_several_targets_all_or_nothing(tmp_path, monkeypatch):
    out = tmp_path / "new" / "deeper"
    (tmp_path / "new").mkdir()
    real_fsync = os.fsync
    calls = []

    def full_disk(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OutputError, match=r"report\.html: no space left on the device"):
        files.write_files({out / "report.json": "{}", out / "report.html": "<html>"}, field="--out")
    # nothing written, no temporary file, the folder made for them removed, the existing one kept
    assert not out.exists() and (tmp_path / "new").is_dir() and _leftovers(tmp_path) == []


def test_a_blocked_target_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "report.html").mkdir()
    with pytest.raises(OutputError, match="it is a folder"):
        files.write_files({tmp_path / "report.json": "{}", tmp_path / "report.html": "x"})
    assert not (tmp_path / "report.json").exists()


def test_interrupt_while_writing_leaves_no_temporary_file(tmp_path, monkeypatch):
    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_text(tmp_path / "x.csv", "a,b\n")
    assert list(tmp_path.iterdir()) == []


def test_a_symlink_is_replaced_never_written_through(tmp_path):
    # a link planted in an output folder (report.json -> another user's file) must not make simdist write there
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "bashrc"
    victim.write_text("old")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.json").symlink_to(victim)
    with pytest.warns(SimdistNote, match="was a symbolic link"):
        files.write_text(tmp_path / "out" / "report.json", "new")
    assert not (tmp_path / "out" / "report.json").is_symlink()
    assert (tmp_path / "out" / "report.json").read_text() == "new" and victim.read_text() == "old"
    # a dangling link and a link to a folder are replaced likewise
    (tmp_path / "out" / "a.html").symlink_to(tmp_path / "nowhere")
    (tmp_path / "out" / "b.html").symlink_to(outside)
    with pytest.warns(SimdistNote):
        files.write_files({tmp_path / "out" / "a.html": "a", tmp_path / "out" / "b.html": "b"})
    assert (tmp_path / "out" / "b.html").read_text() == "b" and outside.is_dir()


def test_open_append_creates_the_file_and_its_folder(tmp_path):
    with files.open_append(tmp_path / "r" / "results.jsonl") as fh:
        fh.write("x\n")
    assert (tmp_path / "r" / "results.jsonl").read_text() == "x\n"
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputError, match="it is a folder"):
        files.open_append(tmp_path / "d")


def test_json_is_strict():
    assert json.loads(files.json_text({"a": [1.5, None]})) == {"a": [1.5, None]}
    with pytest.raises(OutputError, match=r"non-finite number at rows\[1\]\.time_s"):
        files.json_text({"rows": [{"time_s": 1.0}, {"time_s": float("nan")}]})
    with pytest.raises(OutputError, match="at x"):
        files.json_text({"x": float("inf")}, compact=True)


# --------------------------------------------------------------------------- reading
def test_reads_are_bounded_and_never_block(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        files.read_text(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="it is a folder"):
        files.read_text(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert files.read_text(fifo) == ""  # no writer: end of file at once, not a wait for one
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(SpecError, match="larger than 100 B"):
        files.read_text(big, limit=Limit("t", 100, "B", "test"))
    with pytest.raises(SpecError, match="larger than"):
        files.read_bytes("/dev/zero", limit=Limit("t", 4096, "B", "test"))
    assert INPUT_BYTES.value >= 2**20


def test_not_utf8_names_the_line(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"a: 1\nb: \xff\xfe\n")
    with pytest.raises(SpecError, match=r"s.yaml:2: not UTF-8 text \(byte 0xff\)"):
        files.read_text(p)
    assert files.read_text(p, errors="replace").startswith("a: 1")


def test_a_fifo_with_a_writer_is_read(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w').write('a: 1\\n')"])
    try:
        text = ""
        for _ in range(600):  # the writer may not have opened its end yet: then the read sees EOF
            text = files.read_text(fifo)
            if text:
                break
            time.sleep(0.05)
        assert text == "a: 1\n"
    finally:
        writer.wait(timeout=30)
