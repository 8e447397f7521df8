"""The pure parts of the home images (spawners/storage/loopfs.py): the ext4 superblock a hub
reads to measure an unmounted home, and the mount table it reads to find mounted ones."""

from __future__ import annotations

import struct

import pytest

from gpulab.spawners.storage.loopfs import ImageError, ImageHomes, mounts, parse_superblock


def superblock(blocks: int, free: int, overhead: int, log_bs: int = 2, wide: bool = True) -> bytes:
    raw = bytearray(1024)
    struct.pack_into("<7I", raw, 0, 1000, blocks & 0xFFFFFFFF, 0, free & 0xFFFFFFFF, 400, 0, log_bs)
    struct.pack_into("<H", raw, 0x38, 0xEF53)
    struct.pack_into("<I", raw, 0x60, 0x80 if wide else 0)
    struct.pack_into("<I", raw, 0x150, blocks >> 32)
    struct.pack_into("<I", raw, 0x158, free >> 32)
    struct.pack_into("<I", raw, 0x248, overhead)
    return bytes(raw)


def test_a_superblock_gives_room_use_and_inodes() -> None:
    sb = parse_superblock(superblock(blocks=2**33 + 10, free=2**32, overhead=1000))
    assert sb.block_size == 4096 and sb.blocks == 2**33 + 10
    assert sb.capacity_bytes == (2**33 + 10 - 1000) * 4096
    assert sb.used_bytes == (2**33 + 10 - 1000 - 2**32) * 4096
    assert (sb.inodes, sb.used_inodes) == (1000, 600)


def test_the_high_halves_count_only_on_a_64bit_filesystem() -> None:
    raw = bytearray(superblock(blocks=5000, free=100, overhead=10, wide=False))
    struct.pack_into("<I", raw, 0x150, 7)  # garbage where a 32-bit filesystem has no high half
    assert parse_superblock(bytes(raw)).blocks == 5000


def test_what_is_no_ext4_superblock_is_refused() -> None:
    with pytest.raises(ValueError, match="not an ext4 superblock"):
        parse_superblock(b"\0" * 1024)
    with pytest.raises(ValueError):
        parse_superblock(b"short")


def test_mount_points_with_spaces_are_read_back() -> None:
    info = (
        "36 35 98:0 / /mnt/a\\040home rw,noatime master:1 - ext4 /dev/loop3 rw\n"
        "37 35 98:0 / /srv/x rw shared:2 - tmpfs tmpfs rw,size=10k\n"
    )
    got = mounts(info)
    assert [(m.point, m.source, m.fstype) for m in got] == [
        ("/mnt/a home", "/dev/loop3", "ext4"),
        ("/srv/x", "tmpfs", "tmpfs"),
    ]


@pytest.mark.parametrize("name", ["..", "a/b", "", ".hidden", "x" * 201, "al ice"])
def test_a_home_name_is_one_plain_component(tmp_path, name: str) -> None:
    homes = ImageHomes(tmp_path / "users", tmp_path / "images")
    with pytest.raises(ImageError) as e:
        homes.path(name)
    assert e.value.status == 400
