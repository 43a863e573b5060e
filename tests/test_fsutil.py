"""Local file operations (no JVM): atomic writes that name the file when they fail, and
permissions that follow the umask."""

from __future__ import annotations

import os
import stat

import pytest

from pipeline import fsutil


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    path = tmp_path / "run" / "merges.txt"
    fsutil.write_text(None, str(path), "#version: 0.2\n")
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert fsutil.create_exclusive(None, str(tmp_path / "lease"), "x")
    assert stat.S_IMODE((tmp_path / "lease").stat().st_mode) == mode
    assert not fsutil.create_exclusive(None, str(tmp_path / "lease"), "y")
    assert (tmp_path / "lease").read_text() == "x"


def test_a_failed_write_names_the_file_and_leaves_no_temp(tmp_path):
    import resource

    target = tmp_path / "big.txt"
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, old[1]))
    try:
        with pytest.raises(OSError) as err:
            fsutil.write_text(None, str(target), "x" * 5000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    assert err.value.filename == str(target) and err.value.strerror == "File too large"
    assert os.listdir(tmp_path) == []
