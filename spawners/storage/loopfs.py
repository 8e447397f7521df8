"""Homes as filesystem images: one sparse ext4 image per user, loop-mounted at the home's path.

Why: the node's kernel has no quota support (ext4 ``prjquota`` and XFS quotas need CONFIG_QFMT_V2
and XFS_QUOTA, both off here), so each home is a filesystem of its own and its size is the quota.
The kernel then refuses a write past it in the writer's own code (ENOSPC), counts every block
(sparse files count what they hold), runs out of inodes inside the home only, and refuses a hard
link to any file outside it (EXDEV). Measuring a mounted home is one ``statvfs``; an unmounted one
is read from its image's ext4 superblock (:func:`parse_superblock`, pure).

Images live in a root-only folder (``{data_dir}/storage/images/NAME.img``, parents 0700). A home
is mounted ``nodev,nosuid`` from its first
``ensure`` and stays mounted: the hub never unmounts a home behind a running server. Deleted
blocks go back to the host's disk by ``trim`` (FITRIM, when a server stops), not by online
``discard``, which made a write-heavy workload 15x slower (benchmarks/storage_quota.py). It is taken
offline only to shrink it (refused while anything still holds it) or to release it. After a hub
restart, mounts already there (``/proc/self/mountinfo``) are reused, never mounted twice (a lock
per home, in the process and across processes). Root never acts on a path the user controls: the
mount target is opened from the root-owned homes folder without following links, the mount goes
onto that descriptor, and a plain-folder home is copied into its new image by descriptors, never
following a link (:func:`copy_tree`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
FITRIM = 0xC0185879  # _IOWR('X', 121, struct fstrim_range)
UMOUNT_NOFOLLOW = 0x8
O_PATH = getattr(os, "O_PATH", 0o10000000)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MiB = 2**20
# Where ext4 tools live; a hub started from a user's shell may not have sbin on its PATH.
_SBIN = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"])


class ImageError(RuntimeError):
    """A home image could not be made, mounted, resized or released; ``status`` is the HTTP
    status it stands for (409: in use or too full, 500: the node's fault)."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


# ---- the ext4 superblock (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class Ext4Super:
    """What an ext4 superblock says about its filesystem's size and use."""

    block_size: int
    blocks: int
    free_blocks: int
    # journal, inode tables, bitmaps: never the user's (0 = not known: resize2fs clears it and
    # the kernel writes it back at the next mount; :meth:`ImageHomes._settle`)
    overhead_blocks: int
    inodes: int
    free_inodes: int

    @property
    def capacity_bytes(self) -> int:
        return (self.blocks - self.overhead_blocks) * self.block_size

    @property
    def used_bytes(self) -> int:
        return max(0, self.blocks - self.overhead_blocks - self.free_blocks) * self.block_size

    @property
    def used_inodes(self) -> int:
        return self.inodes - self.free_inodes


EXT4_MAGIC = 0xEF53
SUPERBLOCK_OFFSET = 1024
INCOMPAT_64BIT = 0x80


def parse_superblock(raw: bytes) -> Ext4Super:
    """The superblock (the 1024 bytes at offset 1024 of an ext4 image) as numbers; ValueError
    when it is none."""
    if len(raw) < 1024 or struct.unpack_from("<H", raw, 0x38)[0] != EXT4_MAGIC:
        raise ValueError("not an ext4 superblock")
    inodes, blocks_lo, _r, free_lo, free_inodes, _first, log_bs = struct.unpack_from("<7I", raw, 0)
    incompat = struct.unpack_from("<I", raw, 0x60)[0]
    blocks_hi = free_hi = 0
    if incompat & INCOMPAT_64BIT:
        blocks_hi = struct.unpack_from("<I", raw, 0x150)[0]
        free_hi = struct.unpack_from("<I", raw, 0x158)[0]
    return Ext4Super(
        block_size=1024 << log_bs,
        blocks=blocks_lo | blocks_hi << 32,
        free_blocks=free_lo | free_hi << 32,
        overhead_blocks=struct.unpack_from("<I", raw, 0x248)[0],
        inodes=inodes,
        free_inodes=free_inodes,
    )


def read_superblock(image: Path) -> Ext4Super:
    with open(image, "rb") as f:
        f.seek(SUPERBLOCK_OFFSET)
        return parse_superblock(f.read(1024))


# ---- mounts and loop devices -------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    point: str
    source: str
    fstype: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and i + 4 <= len(field):
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(mountinfo: str | None = None) -> list[Mount]:
    """The mounts of this process's namespace (``/proc/self/mountinfo``), in mount order."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 2:
            out.append(Mount(_unescape(fields[4]), _unescape(rest[1]), rest[0]))
    return out


def loop_backing_file(device: str) -> str | None:
    """The image file behind a loop device (``/dev/loop3``), or None."""
    name = os.path.basename(device)
    if not name.startswith("loop"):
        return None
    try:
        text = Path(f"/sys/block/{name}/loop/backing_file").read_text().rstrip("\n")
    except OSError:
        return None
    return text.removesuffix(" (deleted)")


def loop_devices_of(image: Path) -> list[str]:
    """Loop devices set up on ``image`` (normally none or one)."""
    want = str(image)
    out = []
    for entry in Path("/sys/block").glob("loop*"):
        if loop_backing_file(entry.name) == want:
            out.append(f"/dev/{entry.name}")
    return sorted(out)


def _libc() -> ctypes.CDLL:
    c = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    c.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    c.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return c


def _detach(dev: str) -> None:
    """Detach a loop device, quietly (it may be gone already); found on sbin whatever PATH is."""
    exe = shutil.which("losetup", path=_SBIN) or "losetup"
    try:
        subprocess.run([exe, "-d", dev], capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError):
        pass


def _run(*cmd: str, timeout: float = 600) -> str:
    exe = shutil.which(cmd[0], path=_SBIN) or cmd[0]
    try:
        out = subprocess.run(
            [exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise ImageError(f"{cmd[0]} failed: {e}") from None
    if out.returncode != 0:
        raise ImageError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def unmount_below(folder: str | os.PathLike) -> list[str]:
    """Detach every mount at or below ``folder`` (deepest first) and the loop devices of images
    below it; returns the mount points. For a test session's clean-up and a node's removal."""
    top = os.path.realpath(folder).rstrip("/") + "/"
    c = _libc()
    done = []
    for m in reversed(mounts()):
        if (m.point.rstrip("/") + "/").startswith(top):
            if c.umount2(m.point.encode(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0:
                done.append(m.point)
    for entry in Path("/sys/block").glob("loop*"):
        backing = loop_backing_file(entry.name)
        if backing and backing.startswith(top):
            _detach(f"/dev/{entry.name}")
    return done


# ---- copying a plain home into its image, by descriptors ---------------------------------------


def copy_tree(src_fd: int, dst_fd: int) -> int:
    """Copy the folder open at ``src_fd`` into the one at ``dst_fd``: files, folders and links
    as they are (a link is copied, never followed), hard links kept, owners, modes and times
    kept; devices, sockets and fifos left out, and so are files with other names elsewhere that
    the home's owner does not own (a hard link to /etc/shadow is never read). Every entry is
    opened from its folder's descriptor with O_NOFOLLOW, so a link swapped in meanwhile is
    never followed. Returns the number of entries copied."""
    seen: dict[tuple[int, int], tuple[int, str]] = {}
    try:
        return _copy_dir(src_fd, dst_fd, seen, os.fstat(src_fd).st_uid)
    finally:
        for fd, _ in seen.values():
            os.close(fd)


def _copy_dir(src: int, dst: int, seen: dict, owner: int) -> int:
    n = 0
    for name in os.listdir(src):
        try:
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, _DIR, dir_fd=src)
            except OSError:
                continue  # swapped for something else meanwhile
            try:
                os.mkdir(name, 0o700, dir_fd=dst)
                new = os.open(name, _DIR, dir_fd=dst)
                try:
                    n += _copy_dir(sub, new, seen, owner)
                    _keep_meta(new, os.fstat(sub))
                finally:
                    os.close(new)
            finally:
                os.close(sub)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
            os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
        elif stat.S_ISREG(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key not in seen and st.st_uid != owner:
                continue  # someone else's file linked in (/etc/shadow): never read it
            if st.st_nlink > 1 and key in seen:
                first_dir, first_name = seen[key]
                try:
                    os.link(first_name, name, src_dir_fd=first_dir, dst_dir_fd=dst)
                    n += 1
                    continue
                except OSError:
                    pass  # copied again below
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=src)  # fmt: skip
            except OSError:
                continue
            try:
                fst = os.fstat(fd)
                if not stat.S_ISREG(fst.st_mode):
                    continue
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                              dir_fd=dst)  # fmt: skip
                try:
                    _copy_data(fd, out, fst.st_size)
                    _keep_meta(out, fst)
                finally:
                    os.close(out)
            finally:
                os.close(fd)
            if st.st_nlink > 1:
                seen[key] = (os.dup(dst), name)
        else:
            continue  # devices, sockets, fifos: not a home's to keep
        n += 1
    return n


def _copy_data(src: int, dst: int, size: int) -> None:
    """Copy keeping holes (a sparse file stays sparse)."""
    off = 0
    while off < size:
        try:
            data = os.lseek(src, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break
            raise
        hole = os.lseek(src, data, os.SEEK_HOLE)
        pos = data
        while pos < hole:
            chunk = os.pread(src, min(MiB, hole - pos), pos)
            if not chunk:
                break
            os.pwrite(dst, chunk, pos)
            pos += len(chunk)
        off = hole
    os.ftruncate(dst, size)


def _keep_meta(fd: int, st: os.stat_result) -> None:
    os.fchown(fd, st.st_uid, st.st_gid)
    os.fchmod(fd, stat.S_IMODE(st.st_mode))
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


# ---- the image backend -------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageUsage:
    used_bytes: int
    capacity_bytes: int
    files: int
    files_limit: int
    mounted: bool


class ImageHomes:
    """The homes of one data dir as images (see the module's docstring). Methods block."""

    def __init__(self, homes_dir: Path, images_dir: Path) -> None:
        self.homes_dir = Path(homes_dir)
        self.images_dir = Path(images_dir)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def image(self, name: str) -> Path:
        return self.images_dir / f"{_checked(name)}.img"

    def path(self, name: str) -> Path:
        return self.homes_dir / _checked(name)

    def names(self) -> list[str]:
        try:
            return sorted(p.stem for p in self.images_dir.glob("*.img"))
        except FileNotFoundError:
            return []

    @contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """One home's changes at a time: threads of this process, and other processes (a CLI)."""
        with self._locks_lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            self._private_dir(self.images_dir)
            fd = os.open(self.images_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    # ---- state -----------------------------------------------------------------------------

    def mounted_device(self, name: str, table: list[Mount] | None = None) -> str | None:
        """The loop device of ``name``'s image mounted at its home, or None. Something else
        mounted there is an error (the hub never mounts over it). ``table``: the mounts, when
        the caller read them already (a scan reads them once)."""
        target = str(self.path(name))
        image = str(self.image(name))
        for m in reversed(mounts() if table is None else table):
            if m.point == target:
                if loop_backing_file(m.source) == image:
                    return m.source
                raise ImageError(f"{target} has {m.source} ({m.fstype}) mounted, not its image")
        return None

    def usage(self, name: str, table: list[Mount] | None = None) -> ImageUsage | None:
        """The home's use, by ``statvfs`` when mounted, else from its image's superblock; None
        when it has no image."""
        if self.mounted_device(name, table):
            v = os.statvfs(self.path(name))
            return ImageUsage(
                used_bytes=(v.f_blocks - v.f_bfree) * v.f_frsize,
                capacity_bytes=v.f_blocks * v.f_frsize,
                files=v.f_files - v.f_ffree,
                files_limit=v.f_files,
                mounted=True,
            )
        try:
            sb = read_superblock(self.image(name))
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise ImageError(f"{self.image(name)}: {e}") from None
        return ImageUsage(sb.used_bytes, sb.capacity_bytes, sb.used_inodes, sb.inodes, False)

    # ---- making and mounting -----------------------------------------------------------------

    def ensure(self, name: str, quota_bytes: int, uid: int | None, gid: int | None) -> Path:
        """The home of ``name`` mounted at its path (made, or migrated from a plain folder,
        first), its top folder owned by ``uid``:``gid`` and 0700. Idempotent."""
        with self.locked(name):
            if self.mounted_device(name) is None:
                if not self.image(name).exists():
                    self._create(name, quota_bytes, uid, gid)
                self._mount(name)
            self._own_top(name, uid, gid)
        return self.path(name)

    def _private_dir(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for d in (folder, folder.parent):
            st = os.lstat(d)
            if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
                raise ImageError(f"{d} must be a folder of the hub's own, not a link")
        os.chmod(folder, 0o700)
        os.chmod(folder.parent, 0o700)

    def _homes_fd(self) -> int:
        """The homes folder, checked to be the hub's alone (no link, only root may change it)."""
        self.homes_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.homes_dir, _DIR)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            os.close(fd)
            raise ImageError(f"{self.homes_dir} must belong to the hub and be writable by it only")
        return fd

    def _target_fd(self, homes_fd: int, name: str) -> int:
        """The mount point, opened without following a link (made when missing, root's)."""
        try:
            os.mkdir(name, 0o755, dir_fd=homes_fd)
        except FileExistsError:
            pass
        return os.open(name, O_PATH | _DIR, dir_fd=homes_fd)

    def _create(self, name: str, quota_bytes: int, uid: int | None, gid: int | None) -> None:
        """A new image of at least ``quota_bytes`` of room; the plain folder at the home's path
        (a home from before images) is copied into it and then removed."""
        image = self.image(name)
        tmp = image.with_suffix(".img.tmp")
        owner = f"{uid if uid is not None else 0}:{gid if gid is not None else 0}"
        make_image(tmp, quota_bytes, owner)
        homes_fd = self._homes_fd()
        try:
            try:
                old = os.open(name, _DIR, dir_fd=homes_fd)
            except FileNotFoundError:
                old = None
            if old is not None:
                try:
                    if os.listdir(old):
                        self._migrate(name, tmp, old)
                finally:
                    os.close(old)
            os.replace(tmp, image)
            if old is not None:
                self._remove_old_folder(homes_fd, name)
        finally:
            os.close(homes_fd)

    def _migrate(self, name: str, image: Path, old_fd: int) -> None:
        staging = self.images_dir / f".{name}.staging"
        staging.mkdir(mode=0o700, exist_ok=True)
        dev = _run("losetup", "--find", "--show", str(image)).strip()
        c = _libc()
        try:
            _mount_fd(c, dev, os.open(staging, O_PATH | _DIR))
            dst = os.open(staging, _DIR)
            try:
                n = copy_tree(old_fd, dst)
                _keep_meta(dst, os.fstat(old_fd))
            finally:
                os.close(dst)
            log.info("Home %s: copied %d entries of its plain folder into its image", name, n)
        finally:
            c.umount2(str(staging).encode(), UMOUNT_NOFOLLOW)
            _detach(dev)
            os.rmdir(staging)

    def _remove_old_folder(self, homes_fd: int, name: str) -> None:
        """Move the plain folder aside and remove it (by descriptors: shutil.rmtree follows no
        link), leaving an empty mount point."""
        aside = f".{name}.migrated-{int(time.time())}"
        os.rename(name, aside, src_dir_fd=homes_fd, dst_dir_fd=homes_fd)
        os.mkdir(name, 0o755, dir_fd=homes_fd)
        shutil.rmtree(aside, dir_fd=homes_fd)

    def _mount(self, name: str) -> None:
        image = self.image(name)
        devices = loop_devices_of(image)
        # An image already on a loop device (still mounted in a server's own namespace) is
        # mounted from that device again: one filesystem, never two on one image.
        dev = devices[0] if devices else _loop_setup(image)
        homes_fd = self._homes_fd()
        try:
            target = self._target_fd(homes_fd, name)
        finally:
            os.close(homes_fd)
        _mount_fd(_libc(), dev, target)
        if not devices:
            # Detach when the last mount of it goes (lazy: the kernel keeps it while mounted).
            _detach(dev)
        log.info("Home %s: mounted %s from %s", name, self.path(name), dev)

    def _settle(self, name: str) -> None:
        """Mount the image once where nobody can reach it, and unmount it: resize2fs leaves the
        superblock's overhead count at 0, and the kernel writes it back at mount (usage of an
        unmounted home is read from the superblock)."""
        staging = self.images_dir / f".{name}.staging"
        staging.mkdir(mode=0o700, exist_ok=True)
        dev = _run("losetup", "--find", "--show", str(self.image(name))).strip()
        c = _libc()
        try:
            _mount_fd(c, dev, os.open(staging, O_PATH | _DIR))
            c.umount2(str(staging).encode(), UMOUNT_NOFOLLOW)
        finally:
            _detach(dev)
            os.rmdir(staging)

    def _own_top(self, name: str, uid: int | None, gid: int | None) -> None:
        homes_fd = self._homes_fd()
        try:
            fd = os.open(name, _DIR, dir_fd=homes_fd)
        finally:
            os.close(homes_fd)
        try:
            if uid is not None:
                os.fchown(fd, uid, -1 if gid is None else gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)

    def trim(self, name: str) -> int:
        """Give the blocks the home's files no longer use back to the host's disk (holes in the
        image); returns how many bytes were trimmed (0 when not mounted)."""
        with self.locked(name):
            if self.mounted_device(name) is None:
                return 0
            homes_fd = self._homes_fd()
            try:
                fd = os.open(name, _DIR, dir_fd=homes_fd)  # the mount's root: the hub's own
            finally:
                os.close(homes_fd)
            try:
                got = fcntl.ioctl(fd, FITRIM, struct.pack("QQQ", 0, 2**64 - 1, 0))
            finally:
                os.close(fd)
            return struct.unpack("QQQ", got)[1]

    # ---- size --------------------------------------------------------------------------------

    def resize(self, name: str, quota_bytes: int) -> None:
        """Give the home at least ``quota_bytes`` of room. Growing happens online; shrinking
        only offline: the home is unmounted for it, and while anything holds it (a running
        server) the shrink is refused (ImageError 409) and nothing changes."""
        with self.locked(name):
            image = self.image(name)
            if not image.exists():
                return  # made at this size on first ensure
            now = self.usage(name)
            if now is None or now.capacity_bytes == quota_bytes:
                return
            if quota_bytes > now.capacity_bytes:
                self._grow(name, image, quota_bytes, now.mounted)
            else:
                self._shrink(name, image, quota_bytes, now.mounted)

    def _grow(self, name: str, image: Path, quota_bytes: int, mounted: bool) -> None:
        if mounted:
            try:
                self._grow_steps(name, image, quota_bytes, online=True)
                return
            except ImageError as e:
                if "Permission denied" not in str(e):
                    raise
            # The kernel refuses online resizing to this hub (no CAP_SYS_RESOURCE, as in some
            # containers): grow offline if nothing holds the home now, else refuse (409).
            log.info("Home %s: no online resize here; growing it offline", name)
            self._take_offline(name, "a larger quota")
            try:
                self._grow_steps(name, image, quota_bytes, online=False)
            finally:
                self._mount(name)
        else:
            self._grow_steps(name, image, quota_bytes, online=False)

    def _grow_steps(self, name: str, image: Path, quota_bytes: int, online: bool) -> None:
        for _ in range(4):
            u = self.usage(name)
            if u.capacity_bytes >= quota_bytes:
                return
            sb = read_superblock(image)
            size = _round_up(sb.blocks * sb.block_size + quota_bytes - u.capacity_bytes)
            if online:
                dev = self.mounted_device(name)
                os.truncate(image, size)
                _run("losetup", "--set-capacity", dev)
                _run("resize2fs", dev)
            else:
                _run("e2fsck", "-f", "-y", str(image))
                os.truncate(image, size)
                _run("resize2fs", str(image))
                self._settle(name)
        raise ImageError(f"{image}: could not grow to {quota_bytes} bytes of room")

    def _shrink(self, name: str, image: Path, quota_bytes: int, mounted: bool) -> None:
        if mounted:
            self._take_offline(name, "a smaller quota")
        try:
            sb = read_superblock(image)
            size = _round_up(quota_bytes + sb.overhead_blocks * sb.block_size)
            _run("e2fsck", "-f", "-y", str(image))
            try:
                _run("resize2fs", str(image), f"{size // 1024}K")
            except ImageError as e:
                raise ImageError(f"the home holds too much to shrink: {e}", 409) from None
            os.truncate(image, size)
            self._settle(name)
        finally:
            if mounted:
                self._mount(name)

    def _take_offline(self, name: str, why: str = "this") -> None:
        """Unmount the home; refused (ImageError 409, the home left mounted) while a process
        uses it here or a mount of it is left elsewhere (a running server's own namespace)."""
        c = _libc()
        refusal = (
            f"the home is in use by a running server, and {why} is applied with the home "
            "offline: stop your servers and try again"
        )
        if c.umount2(str(self.path(name)).encode(), UMOUNT_NOFOLLOW) != 0:
            raise ImageError(f"{refusal} ({os.strerror(ctypes.get_errno())})", 409)
        deadline = time.monotonic() + 1
        while loop_devices_of(self.image(name)):
            if time.monotonic() > deadline:
                self._mount(name)
                raise ImageError(refusal, 409)
            time.sleep(0.05)

    # ---- release -----------------------------------------------------------------------------

    def unmount(self, name: str) -> bool:
        """Take the home offline (ImageError 409 while it is in use); True if it was mounted."""
        with self.locked(name):
            if self.mounted_device(name) is None:
                return False
            self._take_offline(name)
            return True

    def release(self, name: str) -> bool:
        """Delete the home's image for good, offline first (refused while in use); its empty
        mount point stays for the caller. True if there was an image."""
        with self.locked(name):
            if self.mounted_device(name) is not None:
                self._take_offline(name)
            try:
                self.image(name).unlink()
            except FileNotFoundError:
                return False
            return True


def _loop_setup(image: Path) -> str:
    """A loop device for ``image``, with direct I/O where the host's filesystem allows it (the
    home's pages are cached once, in the home's filesystem, not again in the image file's)."""
    try:
        return _run("losetup", "--find", "--show", "--direct-io=on", str(image)).strip()
    except ImageError:
        return _run("losetup", "--find", "--show", str(image)).strip()


_NAME = re.compile(r"[A-Za-z0-9_-]{1,200}")


def _checked(name: str) -> str:
    """A home's name is one plain path component (``homes.home_name``), never a path."""
    if not _NAME.fullmatch(name):
        raise ImageError(f"{name!r} is no home name (letters, digits, '_' and '-')", 400)
    return name


def _round_up(n: int, unit: int = MiB) -> int:
    return -(-n // unit) * unit


def _mount_fd(c: ctypes.CDLL, dev: str, target_fd: int) -> None:
    """Mount ``dev`` (ext4) onto the folder open at ``target_fd`` (closed here)."""
    try:
        if not stat.S_ISDIR(os.fstat(target_fd).st_mode):
            raise ImageError("the mount point is not a folder")
        where = f"/proc/self/fd/{target_fd}".encode()
        if c.mount(dev.encode(), where, b"ext4", MS_NODEV | MS_NOSUID, None) != 0:
            err = ctypes.get_errno()
            raise ImageError(f"mount {dev}: {os.strerror(err)}")
    finally:
        os.close(target_fd)


def make_image(path: Path, room_bytes: int, owner: str = "0:0") -> Ext4Super:
    """A sparse ext4 image at ``path`` with at least ``room_bytes`` for files (its metadata on
    top), its top folder owned by ``owner`` ("uid:gid"). mkfs is quick and writes about 5 MB
    for a 50 GB home: the image is sparse, its inode tables and journal holes (zeroes)."""
    size = _round_up(room_bytes + max(room_bytes // 32, 8 * MiB))
    for _ in range(4):
        with open(path, "wb") as f:
            f.truncate(size)
        _run(
            "mkfs.ext4",
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            # mkfs punches the (sparse) file first and so knows its inode tables are zeroes:
            # no lazy zeroing of them at mount either
            f"lazy_itable_init=1,lazy_journal_init=1,root_owner={owner}",
            str(path),
        )
        sb = read_superblock(path)
        if sb.capacity_bytes >= room_bytes:
            os.chmod(path, 0o600)
            return sb
        size = _round_up(size + room_bytes - sb.capacity_bytes)
    raise ImageError(f"could not make an image with {room_bytes} bytes of room")


def can_loop_mount(scratch: Path) -> str:
    """Whether this process can make and loop-mount an image ('' if so, else why not)."""
    if os.geteuid() != 0:
        return "the hub does not run as root"
    for tool in ("mkfs.ext4", "losetup", "resize2fs", "e2fsck"):
        if shutil.which(tool, path=_SBIN) is None:
            return f"{tool} is missing (Debian: apt-get install e2fsprogs util-linux)"
    scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    image, point = scratch / "probe.img", scratch / "probe"
    point.mkdir(exist_ok=True)
    dev = ""
    try:
        make_image(image, 4 * MiB)
        dev = _run("losetup", "--find", "--show", str(image)).strip()
        _mount_fd(_libc(), dev, os.open(point, O_PATH | _DIR))
        _libc().umount2(str(point).encode(), UMOUNT_NOFOLLOW)
        return ""
    except (ImageError, OSError) as e:
        return str(e)
    finally:
        if dev:
            _detach(dev)
        image.unlink(missing_ok=True)
        try:
            point.rmdir()
        except OSError:
            pass
