"""The disk sweep: its rules on a reference table, the refusals, and the bypass on a real file."""

import mmap
import os
import sys

import pytest

from leadline.errors import InputError
from leadline.measure.disk import (
    MEMORY_FILESYSTEMS,
    DepthRow,
    _PosixReader,
    _sweep,
    disk_queue_depth,
    filesystem_of,
    gain_over_shallowest,
    summarise,
)

MIB = 1 << 20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_DIRECT and fadvise are Linux's")


def _rows(table):
    return [DepthRow(d, 1, 1, 1.0, mb, 1.0, 1.0) for d, mb in table]


def test_seed_table_optimum_enough_and_collapse():
    # a DRAM-less Kingston NV1 with FILE_FLAG_NO_BUFFERING
    seed = _rows([(1, 1017), (2, 1655), (3, 1703), (4, 1535), (6, 1270), (8, 1035)])
    # optimum QD3; QD2 is within 5% (97%); QD6 is 75% of the optimum: collapsed
    assert summarise(seed) == (3, 2, 6)


def test_a_dip_that_recovers_is_not_a_collapse():
    # QD3 dips below 80% of the optimum but QD4 recovers; from QD16 on it stays down
    table = [(1, 1259), (2, 1737), (3, 1363), (4, 1695), (6, 1275), (8, 1448), (16, 1144), (32, 1163)]
    assert summarise(_rows(table)) == (2, 2, 16)


def test_a_flat_disk_never_collapses():
    assert summarise(_rows([(1, 1400), (2, 1420), (4, 1415), (8, 1380), (32, 1300)])) == (2, 1, None)


def test_the_optimum_is_tested_against_qd1_round_by_round():
    steady = [DepthRow(1, 1, 1, 1.0, 1000, 1, 1, [1000, 1010, 990]), DepthRow(3, 1, 1, 1.0, 1700, 1, 1, [1700, 1690, 1710])]
    g = gain_over_shallowest(steady, 3)
    assert g["mean"] == pytest.approx(700) and g["ci_low"] > 600 and g["n"] == 3
    # the seed-like shape on a noisy shared disk: QD1's rounds 1,174-2,454 swallow the gain
    noisy = [DepthRow(1, 1, 1, 1.0, 1247, 1, 1, [1174, 2454, 1211, 1247, 1470]), DepthRow(3, 1, 1, 1.0, 1719, 1, 1, [1463, 1719, 2042, 1700, 1650])]
    g = gain_over_shallowest(noisy, 3)
    assert g["ci_low"] < 0 < g["mean"]
    assert gain_over_shallowest(noisy, 1) is None
    assert gain_over_shallowest([DepthRow(1, 1, 1, 1.0, 9, 1, 1, [9]), DepthRow(2, 1, 1, 1.0, 9, 1, 1, [9])], 2) is None


def test_filesystem_of_takes_the_longest_mount():
    mounts = "/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n/dev/nvme0n1p1 /data xfs rw 0 0\n"
    assert filesystem_of("/dev/shm/x.bin", mounts) == "tmpfs"
    assert filesystem_of("/data/models/a.safetensors", mounts) == "xfs"
    assert filesystem_of("/database/x", mounts) == "ext4"  # /data is not a prefix of /database


def _file(path, mib):
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())
    return path


def test_missing_and_too_small_files_are_one_sentence(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        disk_queue_depth(tmp_path / "nope.bin")
    with pytest.raises(InputError, match="no file matches"):
        disk_queue_depth(str(tmp_path / "*.safetensors"))
    small = _file(tmp_path / "small.bin", 3)
    with pytest.raises(InputError, match=r"too small to measure: queue depth 32 needs 256\.0 MiB"):
        disk_queue_depth(small)


@linux
def test_memory_filesystem_is_refused_not_measured():
    shm = "/dev/shm"
    if not os.path.isdir(shm) or filesystem_of(shm) not in MEMORY_FILESYSTEMS:
        pytest.skip("no tmpfs at /dev/shm here")
    path = os.path.join(shm, f"leadline-test-{os.getpid()}.bin")
    try:
        _file(path, 2)
        with pytest.raises(InputError, match="which is memory, not a disk"):
            disk_queue_depth(path, depths=(1,), block_bytes=MIB)
    finally:
        os.unlink(path)


def _direct_ok(path):
    try:
        r = _PosixReader(str(path), direct=True)
    except OSError:
        return False
    buf = mmap.mmap(-1, MIB)
    try:
        r.read(buf, 0)
        return True
    except OSError:
        return False
    finally:
        r.close()
        buf.close()


@linux
def test_direct_reader_reads_the_right_bytes(tmp_path):
    path = _file(tmp_path / "data.bin", 4)
    if not _direct_ok(path) or filesystem_of(path) in MEMORY_FILESYSTEMS:
        pytest.skip(f"{tmp_path} does not support O_DIRECT on a disk")
    r, buf = _PosixReader(str(path), direct=True), mmap.mmap(-1, MIB)
    try:
        assert r.read(buf, 2 * MIB) == MIB
        with open(path, "rb") as f:
            f.seek(2 * MIB)
            assert bytes(buf) == f.read(MIB)
    finally:
        r.close()
        buf.close()


def _mb_per_s(rows):
    return sum(r.bytes for r in rows) / sum(r.seconds for r in rows) / 1e6


@linux
def test_bypass_verified_second_pass_is_not_faster(tmp_path):
    """Cold cache, one direct pass, then three more: their median may not beat the first by
    more than 3x. (On this shared 2-core VM, 20 direct passes spread over 710-1,750 MB/s.)

    The control first shows the factor can fail here: a buffered pass over the same file just
    after the cold one is served from the page cache and must be more than 3x faster (it was
    5.6x: 1,778 against 9,942 MB/s), or the test is skipped as unable to tell them apart.
    """
    path = _file(tmp_path / "sweep.bin", 64)
    if not _direct_ok(path) or filesystem_of(path) in MEMORY_FILESYSTEMS:
        pytest.skip(f"{tmp_path} does not support O_DIRECT on a disk")
    kw = {"depths": (1, 2), "block_bytes": MIB, "bytes_per_depth": 32 * MIB, "rounds": 1}  # one pass = the whole file

    def drop_cache():
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    def buffered_pass():
        blocks = [(0, k * MIB) for k in range(64)]
        return _mb_per_s(_sweep([path], blocks, (1, 2), MIB, 32 * MIB, 1, False, lambda _m: None, "buffered"))

    drop_cache()
    cold = buffered_pass()
    warm = max(buffered_pass() for _ in range(3))  # the page cache's speed, spared a busy CPU
    if warm <= 3 * cold:
        pytest.skip(f"this disk reads as fast as the page cache ({cold:,.0f} against {warm:,.0f} MB/s), so a bypass cannot be told apart here")
    drop_cache()
    first = disk_queue_depth(path, **kw)
    later = [_mb_per_s(disk_queue_depth(path, **kw).rows) for _ in range(3)]
    assert first.bypass == "O_DIRECT"
    assert sorted(later)[1] <= 3 * _mb_per_s(first.rows)
    assert [r.reads for r in first.rows] == [32, 32] and {r.bytes for r in first.rows} == {32 * MIB}
    assert set(first.as_values()) == {"disk_read_mb_per_s", "disk_queue_depth"}
    text = first.text()
    assert "optimum: QD" in text and "buffered" not in text.splitlines()[1]
