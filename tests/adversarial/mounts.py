"""Small file systems a test can fill or break, for the storage-outage
tests (they need root, which CI and the development machines have).

- ``small_disk``: a tmpfs of the given size; if the kernel refuses it, an
  ext4 image of that size on a loop device.
- ``ext4_disk``: an ext4 image on a loop device, mounted
  ``errors=remount-ro``; ``make_read_only`` makes the kernel turn it
  read-only under its open files, as it does after a disk error. (A plain
  ``mount -o remount,ro`` is refused with EBUSY while any file on the file
  system is open for writing, which a running SQLite database always is.)

Where neither works, the test fails when ``JOBDECK_REQUIRE_MOUNTS=1`` or
``CI`` is set (CI must never pass by skipping) and skips otherwise.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for

UNMOUNT_WAIT = 30.0
"""How long ``remount`` waits for the file system's last open file to close."""


def required() -> bool:
    return os.environ.get("JOBDECK_REQUIRE_MOUNTS") == "1" or bool(os.environ.get("CI"))


def _refuse(message: str) -> None:
    if required():
        pytest.fail(message)
    pytest.skip(message)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


def _unmount(folder: Path) -> None:
    if _run("umount", str(folder)).returncode != 0:
        _run("umount", "-l", str(folder))  # a process the test killed may still be closing its files


def _mount_ext4(image: Path, folder: Path, size_mb: int, options: str = "") -> str | None:
    """Mount a fresh ext4 image of ``size_mb`` at ``folder``; the error, or None."""
    image.unlink(missing_ok=True)
    with image.open("wb") as fh:
        fh.truncate(size_mb << 20)
    made = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
    if made.returncode != 0:
        return f"mkfs.ext4: {made.stderr.strip()}"
    mounted = _run("mount", "-o", f"loop{',' + options if options else ''}", str(image), str(folder))
    return None if mounted.returncode == 0 else f"mount -o loop: {mounted.stderr.strip()}"


@contextlib.contextmanager
def small_disk(tmp_path: Path, size_mb: int, folder: Path | None = None) -> Iterator[Path]:
    """A folder (``tmp_path / "disk"`` unless given) on a file system of
    ``size_mb`` megabytes, unmounted after."""
    folder = folder or tmp_path / "disk"
    folder.mkdir(exist_ok=True)
    tmpfs = _run("mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=755", "tmpfs", str(folder))
    if tmpfs.returncode != 0:
        error = _mount_ext4(tmp_path / "disk.img", folder, size_mb)
        if error is not None:
            _refuse(f"cannot mount a small file system: tmpfs: {tmpfs.stderr.strip()}; {error}")
    try:
        yield folder
    finally:
        _unmount(folder)


class Ext4Disk:
    """A mounted ext4 image that the test can make read-only."""

    def __init__(self, folder: Path, image: Path) -> None:
        self.folder = folder
        self.image = image
        self._trigger = self._trigger_of(folder)

    @staticmethod
    def _trigger_of(folder: Path) -> Path:
        source = _run("findmnt", "-no", "SOURCE", str(folder)).stdout.strip()
        return Path("/sys/fs/ext4") / Path(source).name / "trigger_fs_error"

    def remount(self) -> None:
        """Unmount and mount again, writable (its journal replayed): what an
        operator does once the disk is sound.

        The image goes on a loop device of its own. The kernel keeps one
        instance of a file system per device, alive while anything holds it:
        a file still open, or a copy of the mount in a mount namespace made
        while it was mounted (``unshare -m``, ``ip netns exec``: the
        partition tests make them, beside this one in a parallel run).
        Mounted again through the same device, the image came back as that
        instance, still read-only (seen in two CI-like runs: the restarted
        server's first write failed, "attempt to write a readonly
        database", and the kernel logged no second mount). The old instance
        writes nothing: its journal was aborted. A file written and synced
        proves the new mount writable before the test goes on."""
        wait_for(
            lambda: _run("umount", str(self.folder)).returncode == 0,
            UNMOUNT_WAIT,
            interval=0.05,
            message=f"the last open file on {self.folder} to close (fuser -vm names who holds it)",
        )
        attached = _run("losetup", "--find", "--show", str(self.image))
        assert attached.returncode == 0, attached.stderr
        device = attached.stdout.strip()
        mounted = _run("mount", "-o", "errors=remount-ro", device, str(self.folder))
        _run("losetup", "--detach", device)  # in use: the kernel detaches it when it is unmounted
        assert mounted.returncode == 0, mounted.stderr
        probe = self.folder / ".writable"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"remounted\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
        self._trigger = self._trigger_of(self.folder)

    def make_read_only(self) -> None:
        """What ext4 does with ``errors=remount-ro`` when the disk fails: every
        write from then on, through files already open too, gets EROFS."""
        self._trigger.write_text("jobdeck storage outage test\n")


@contextlib.contextmanager
def ext4_disk(tmp_path: Path, size_mb: int = 64) -> Iterator[Ext4Disk]:
    folder = tmp_path / "ext4"
    folder.mkdir()
    image = tmp_path / "ext4.img"
    error = _mount_ext4(image, folder, size_mb, "errors=remount-ro")
    if error is not None:
        _refuse(f"cannot mount an ext4 image: {error}")
    try:
        disk = Ext4Disk(folder, image)
        if not disk._trigger.exists():
            _refuse(f"this kernel has no {disk._trigger} to turn ext4 read-only on an error")
        yield disk
    finally:
        _unmount(folder)


def fill(folder: Path, name: str = "ballast") -> Path:
    """Write a file in ``folder`` until the file system is full; returns it."""
    path = folder / name
    block = b"\0" * (64 << 10)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError:
                if len(block) == 512:
                    break
                block = block[: len(block) // 2]  # the last few blocks, to the byte
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
    return path


def free_bytes(folder: Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize
