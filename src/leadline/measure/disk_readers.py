"""Reading a file with the page cache bypassed: the bypass this platform uses (:func:`bypass_name`),
the filesystem a file lives on (:func:`filesystem_of`, and :data:`MEMORY_FILESYSTEMS`, those that
are memory, not a disk), and one reader per platform that fills an aligned buffer at an aligned
offset (``O_DIRECT`` or ``F_NOCACHE`` through ``os.preadv``, ``FILE_FLAG_NO_BUFFERING`` through
``ReadFile``). Stdlib only.
"""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs", "rootfs"})
_F_NOCACHE = 48  # macOS <sys/fcntl.h>


def filesystem_of(path: str | os.PathLike[str], mounts_text: str | None = None) -> str | None:
    """The filesystem type holding ``path``: the longest mount point of ``/proc/self/mounts``
    (or ``mounts_text``) that contains it; None where there is no mount table.

    Examples:
        >>> mounts = "/dev/vda1 / ext4 rw 0 0\\ntmpfs /tmp tmpfs rw 0 0\\n/dev/vdb1 /tmp/data xfs rw 0 0"
        >>> filesystem_of("/tmp/w.bin", mounts), filesystem_of("/tmp/data/w.bin", mounts), filesystem_of("/srv", mounts)
        ('tmpfs', 'xfs', 'ext4')
        >>> filesystem_of("/tmp/w.bin", mounts) in MEMORY_FILESYSTEMS
        True
    """
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    real = os.path.realpath(path)
    best, fstype = "", None
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, fstype = mnt, parts[2]
    return fstype


def bypass_name() -> str:
    """The cache bypass this platform uses: ``FILE_FLAG_NO_BUFFERING`` on Windows, ``F_NOCACHE``
    on macOS, ``O_DIRECT`` elsewhere.

    Examples:
        >>> bypass_name()  # on Linux
        'O_DIRECT'
    """
    return {"win32": "FILE_FLAG_NO_BUFFERING", "darwin": "F_NOCACHE"}.get(sys.platform, "O_DIRECT")


class _PosixReader:
    """One file descriptor; ``read`` fills an aligned buffer at an aligned offset."""

    def __init__(self, path: str, direct: bool) -> None:
        flags = os.O_RDONLY
        if direct and sys.platform.startswith("linux"):
            flags |= os.O_DIRECT
        self.fd = os.open(path, flags)
        if direct and sys.platform == "darwin":  # pragma: no cover - not this platform
            import fcntl

            fcntl.fcntl(self.fd, _F_NOCACHE, 1)

    def read(self, buf: mmap.mmap, offset: int) -> int:
        if hasattr(os, "preadv"):
            return os.preadv(self.fd, [buf], offset)
        data = os.pread(self.fd, len(buf), offset)  # pragma: no cover - macOS < 11
        buf[: len(data)] = data
        return len(data)

    def close(self) -> None:
        os.close(self.fd)


class _WindowsReader:  # pragma: no cover - exercised on Windows only
    """CreateFileW with FILE_FLAG_NO_BUFFERING; ReadFile at an offset given by an OVERLAPPED."""

    def __init__(self, path: str, direct: bool) -> None:
        import ctypes
        from ctypes import wintypes

        self._ct = ctypes
        k32 = ctypes.WinDLL("kernel32", use_last_error=True)
        k32.CreateFileW.restype = wintypes.HANDLE
        k32.CreateFileW.argtypes = [wintypes.LPCWSTR, wintypes.DWORD, wintypes.DWORD, wintypes.LPVOID, wintypes.DWORD,
                                    wintypes.DWORD, wintypes.HANDLE]
        k32.ReadFile.argtypes = [wintypes.HANDLE, wintypes.LPVOID, wintypes.DWORD, ctypes.POINTER(wintypes.DWORD),
                                 wintypes.LPVOID]
        k32.CloseHandle.argtypes = [wintypes.HANDLE]
        flags = 0x20000000 if direct else 0x80  # FILE_FLAG_NO_BUFFERING / FILE_ATTRIBUTE_NORMAL
        h = k32.CreateFileW(path, 0x80000000, 0x1, None, 3, flags, None)  # GENERIC_READ, FILE_SHARE_READ, OPEN_EXISTING
        if h is None or h == ctypes.c_void_p(-1).value:
            raise ctypes.WinError(ctypes.get_last_error())
        self.k32, self.h = k32, h

        class Overlapped(ctypes.Structure):
            _fields_ = [("Internal", ctypes.c_void_p), ("InternalHigh", ctypes.c_void_p), ("Offset", wintypes.DWORD),
                        ("OffsetHigh", wintypes.DWORD), ("hEvent", wintypes.HANDLE)]

        self._ov, self._dword = Overlapped, wintypes.DWORD

    def read(self, buf: mmap.mmap, offset: int) -> int:
        ct = self._ct
        ov = self._ov()
        ov.Offset, ov.OffsetHigh = offset & 0xFFFFFFFF, offset >> 32
        got = self._dword(0)
        target = (ct.c_char * len(buf)).from_buffer(buf)
        if not self.k32.ReadFile(self.h, target, len(buf), ct.byref(got), ct.byref(ov)):
            raise ct.WinError(ct.get_last_error())
        return int(got.value)

    def close(self) -> None:
        self.k32.CloseHandle(self.h)


def _reader(path: str, direct: bool) -> _PosixReader | _WindowsReader:
    return _WindowsReader(path, direct) if sys.platform == "win32" else _PosixReader(path, direct)
