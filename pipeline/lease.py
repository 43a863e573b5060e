"""One run at a time per run directory: a lease file that overlapping runs respect.

A scheduler may start a retry while the first attempt still runs, or two schedules may point
at the same output. Before it writes anything, a training run takes the lease of its run
directory, ``.lease.json``, and of its checkpoint directory, beside it
(``.checkpoints.lease.json`` in the run directory for the default one), each with the
holder's host, pid, start time and the time it last renewed it. The file is created
exclusively (locally a written temp file hard-linked to the name, so it is never seen empty;
``createNewFile`` on HDFS), renewed by a background thread every ``timeout / 4`` seconds, and
deleted when the run ends. A lease file that cannot be read (a writer that died creating it)
is taken over once it has not changed for ``timeout`` seconds.

Nothing is written inside a directory another run holds: a lease is refused while a directory
that encloses it (a checkpoint directory or a word table inside a running run's directory) has
a live ``.lease.json`` of another process.

A second run finds the lease held and stops with one line naming the holder, unless the
holder is gone: on the same host its process no longer exists, or anywhere its last renewal is
older than ``timeout`` seconds. A gone holder's lease is taken over, with a log line. (On an
object store without atomic create, two runs starting in the same second can both believe
they won; the renewal check notices within ``timeout / 4`` seconds and one of them stops.)
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

from pipeline import fsutil
from pipeline.config import ConfigError

log = logging.getLogger(__name__)

NAME = ".lease.json"
RELEASE_WAIT_SECONDS = 20.0  # how long a release waits for a renewal being written (a slow fsync)


def _now() -> float:
    return time.time()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


_HELD_HERE: set[str] = set()  # the ids of the leases this process holds


class LeaseHeld(ConfigError):
    """The directory is leased by another run that is still alive."""


class Lease:
    """The lease ``directory/name`` (``.lease.json`` of a run directory by default; see
    :meth:`beside` for an output that is replaced whole)."""

    def __init__(self, spark, directory: str, timeout: float, purpose: str = "run",
                 name: str = NAME):
        self.spark, self.dir, self.timeout, self.purpose = spark, directory, timeout, purpose
        self.path = fsutil.join(directory, name)
        self.held = directory  # what the error names
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), **_pid_space(),
                   "started": _iso(_now()), "id": uuid.uuid4().hex}
        self._stop = threading.Event()
        self._renewing = threading.Lock()  # held while the renewal thread writes the file
        self._thread: threading.Thread | None = None
        self.lost = False  # set when another run took the lease (this one must stop)
        self.confirmed = time.monotonic()  # when a read of the file last showed it ours

    @classmethod
    def beside(cls, spark, output: str, timeout: float, purpose: str) -> Lease:
        """The lease of an output directory that is written elsewhere and moved into place
        whole (a word table, an encoded corpus): ``.<name>.lease.json`` next to it, where
        replacing the directory cannot remove it."""
        parent, name = fsutil.split_parent(output)
        lease = cls(spark, parent, timeout, purpose, f".{name}.lease.json")
        lease.held = output
        return lease

    # -- the file ----------------------------------------------------------------------------------
    def _record(self) -> str:
        return json.dumps({**self.me, "renewed": _now(), "renewed_at": _iso(_now()),
                           "timeout": self.timeout}, indent=1)

    def _read(self) -> dict | None:
        """The holder's record; None when the file is not there or cannot be read as one (not
        JSON, or JSON of another shape: it then counts as unreadable, taken over once old)."""
        return self._read_or_why()[0]

    def _read_or_why(self) -> tuple[dict | None, str]:
        """(the holder's record or None, why it could not be read: '' when the file is not
        there or is not a lease record; the error when the storage failed to read it, which
        says nothing about who holds it: a store's 503, a timeout)."""
        try:
            holder = json.loads(fsutil.read_text(self.spark, self.path))
        except (FileNotFoundError, ValueError):
            return None, ""
        except Exception as exc:  # noqa: BLE001 - an OSError, or a Hadoop one through py4j
            return None, (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return (holder, "") if _well_formed(holder) else (None, "")

    def _gone(self, holder: dict) -> str:
        """Why the holder is gone ('' if it may be alive)."""
        age = _now() - holder["renewed"]
        if age > self.timeout:
            # (unless its file changed since: a holder whose clock is behind this host's, or
            # this host's clock stepped forward, renews a stamp that looks old)
            still = self._file_age()
            if still is None or still[1] > self.timeout:
                return f"its last renewal was {age:,.0f} s ago (lease_timeout_seconds = " \
                       f"{self.timeout:g})"
        if age < -self.timeout:  # its host's clock is ahead: the file's own age decides
            still = self._file_age()
            if still is not None and still[1] > self.timeout:
                return (f"its last renewal is stamped {-age:,.0f} s ahead of this host's "
                        f"clock and its file has not changed for {still[1]:,.0f} s "
                        f"(lease_timeout_seconds = {self.timeout:g})")
        if holder.get("pid") and self._same_pid_space(holder) \
                and not _process_exists(holder["pid"]):
            return "its process no longer exists"
        return ""

    def _file_age(self) -> tuple[int, float] | None:
        """(size, seconds since the lease file last changed), by the storage's clock; None if
        it is not there."""
        try:
            size, mtime = fsutil.file_status(self.spark, self.path)
        except Exception:  # noqa: BLE001 - removed meanwhile: look again
            return None
        return size, _now() - (mtime / 1e9 if fsutil.is_local(self.path) else mtime / 1e3)

    def _unreadable_and_old(self) -> str:
        """Why a lease file that cannot be read counts as gone: not changed for ``timeout``
        seconds (a writer that died between creating and writing it; a live holder rewrites
        it every ``timeout / 4``); '' while it may still be being written, or is not there."""
        status = self._file_age()
        if status is None or status[1] <= self.timeout:
            return ""
        size, age = status
        return (f"its file cannot be read ({size} bytes, empty, not JSON or not a lease "
                f"record) and has not changed for {age:,.0f} s (lease_timeout_seconds = "
                f"{self.timeout:g})")

    def _create_is_atomic(self) -> bool:
        """Whether creating the lease file is atomic where it is: locally (a hard link, or
        O_EXCL) and on HDFS (createNewFile at the namenode); not on object stores."""
        return fsutil.is_local(self.path) or fsutil.scheme(self.path) in ("hdfs", "viewfs")

    def _same_pid_space(self, holder: dict) -> bool:
        """Whether the holder's pid can be looked up here: the same host name is not enough
        where containers share one (host networking) but not their process ids, so the pid
        namespace and the boot id must match too (when the lease records them)."""
        if holder.get("host") != self.me["host"]:
            return False
        return all(holder.get(k) in (None, v) for k, v in self.me.items()
                   if k in ("pid_ns", "boot_id") and v is not None)

    def _refusal(self, holder: dict, what: str) -> str:
        age = _now() - holder["renewed"]
        seen = (f"last renewed by a clock {-age:,.0f} s ahead of this host's" if age < 0 else
                f"last renewed by a clock {age:,.0f} s behind this host's (its file changed "
                "since)" if age > self.timeout else f"last seen {age:,.0f} s ago")
        return (f"{what} is in use by another {self.purpose} (host {holder.get('host')}, "
                f"pid {holder.get('pid')}, started {holder.get('started')}, {seen})")

    def _refuse_inside_a_live_run(self) -> None:
        """Refuse when a directory enclosing ``held`` is leased by another live process (a
        lease of this process, a run taking its word table's lease, is its own)."""
        here = self.held
        if fsutil.is_local(here):  # (a relative path: its real ancestors, not its text's)
            here = os.path.abspath(fsutil.local_path(here))
        while True:
            parent, _ = fsutil.split_parent(here)
            if parent in (here, ".") or parent.endswith("://"):
                return
            here = parent
            path = fsutil.join(here, NAME)
            try:  # (a store may refuse to look outside the prefix this job may read)
                if not fsutil.exists(self.spark, path):
                    continue
                holder = Lease(self.spark, here, self.timeout)._read()
            except Exception:  # noqa: BLE001 - what cannot be looked at holds no lease of ours
                continue
            if holder is None or holder.get("id") in _HELD_HERE:  # (this process's own)
                continue
            other = Lease(self.spark, here, float(holder.get("timeout", self.timeout)))
            if not other._gone(holder):
                raise LeaseHeld(
                    f"{self.held} is inside {here}, which "
                    + other._refusal(holder, "").lstrip()
                    + f"; write elsewhere, or wait for that run to finish (its lease: {path})")

    # -- acquire / renew / release -----------------------------------------------------------------
    def acquire(self) -> Lease:
        self._refuse_inside_a_live_run()
        fsutil.mkdirs(self.spark, self.dir)
        for _ in range(3):
            if fsutil.create_exclusive(self.spark, self.path, self._record()):
                if self._create_is_atomic():
                    break
                # an object store's "create if absent" is a look then a write: two runs can
                # both get True; the last writer wins, so look again, as a takeover does
                time.sleep(0.2)
                if (self._read() or {}).get("id") == self.me["id"]:
                    break
                continue
            holder = self._read()
            if (holder or {}).get("id") == self.me["id"]:  # (ours: a store's read-back that
                break  # was late, above)
            if holder is None:  # being written or removed right now: look again
                stale = self._unreadable_and_old()
                if not stale:
                    time.sleep(0.2)
                    continue
                log.warning("taking over the lease of %s: %s", self.held, stale)
                holder, why = {}, stale
            else:
                why = self._gone(holder)
            if not why:
                raise LeaseHeld(
                    self._refusal(holder, self.held) + f"; wait for it to finish, or, if it is "
                    f"gone, delete {self.path} (a lease not renewed for lease_timeout_seconds "
                    f"= {self.timeout:g} is taken over by itself)")
            if holder:
                log.warning("taking over the lease of %s from host %s pid %s (started %s): "
                            "%s", self.held, holder.get("host"), holder.get("pid"),
                            holder.get("started"), why)
            fsutil.write_text(self.spark, self.path, self._record())
            time.sleep(0.2)  # a concurrent taker writes too: the last writer wins, check
            if (self._read() or {}).get("id") == self.me["id"]:
                break
        else:
            if self._read() is None and fsutil.exists(self.spark, self.path):
                raise LeaseHeld(
                    f"could not take the lease of {self.held}: {self.path} cannot be read "
                    f"(empty or not JSON: its writer died while creating it?); it is taken "
                    f"over once {self.timeout:g} s (lease_timeout_seconds) old, or delete it")
            raise LeaseHeld(f"could not take the lease of {self.held} ({self.path})")
        self._thread = threading.Thread(target=self._renew, name="spark-bpe-lease",
                                        daemon=True)
        self._thread.start()
        _HELD_HERE.add(self.me["id"])
        return self

    def _still_mine(self) -> bool:
        """Whether the lease file still names this run; False (and ``lost`` set, with a log
        line) when it names another run, or is gone: a run that took it over while this one
        was stalled (a VM pause, a stopped process) and has released it since. A file that
        cannot be read is looked at once more before it counts as gone."""
        if self.lost:
            return False
        holder, why = self._read_or_why()
        if holder is None:
            time.sleep(0.2)
            holder, why = self._read_or_why()
        if holder is None and why and time.monotonic() - self.confirmed < self.timeout:
            # the storage failed: no news of another holder; seen ours less than a timeout
            # ago, it is still ours (no other run may take it over before the timeout), so
            # look again at the next check. Not after a longer gap (a stalled run, resumed,
            # whose lease another run may have taken meanwhile): that counts as lost
            log.warning("could not read the lease file %s (%s); looking again at the next "
                        "check", self.path, why)
            return True
        if holder is not None and holder.get("id") == self.me["id"]:
            self.confirmed = time.monotonic()
            return True
        self.lost = True
        if holder is None:
            log.error("the lease file of %s is gone: another run took the directory over "
                      "(or the file was deleted) while this one ran", self.held)
        else:
            log.error("the lease of %s was taken by host %s pid %s", self.held,
                      holder.get("host"), holder.get("pid"))
        return False

    def holds(self) -> bool:
        """Whether this run still holds the lease, read from the file now (not only what the
        renewal thread saw last: a run stopped past its lease's timeout and resumed must not
        write once before that thread looks)."""
        return self._still_mine()

    def _renew(self) -> None:
        while not self._stop.wait(self.timeout / 4):
            with self._renewing:  # (a release waits for this write: it must not outlive it)
                if self._stop.is_set() or not self._still_mine():
                    return
                try:
                    fsutil.write_text(self.spark, self.path, self._record())
                except Exception as exc:  # noqa: BLE001 - a failed renewal is retried next time
                    log.warning("could not renew the lease of %s: %s", self.held, exc)

    def check(self) -> None:
        """Raise if this run no longer holds its lease. Reads the lease file (not only what
        the renewal thread saw last): call it before each write the lease protects."""
        if not self._still_mine():
            raise LeaseHeld(f"another run took over {self.held} while this one ran; "
                            "this run stops without publishing")

    def release(self) -> None:
        """Stop renewing and delete the file. A renewal being written (its fsync slow on a busy
        disk) is waited for first: written after the delete, it would leave a lease behind."""
        self._stop.set()
        _HELD_HERE.discard(self.me["id"])
        try:
            if not self._renewing.acquire(timeout=RELEASE_WAIT_SECONDS):
                log.warning("the lease %s is still being renewed after %g s; it is left to go "
                            "stale (lease_timeout_seconds = %g)", self.path,
                            RELEASE_WAIT_SECONDS, self.timeout)
                return
            self._renewing.release()
        except BaseException:  # a second SIGTERM while waiting: remove the lease all the same
            self._delete_if_mine()
            raise
        self._delete_if_mine()

    def _delete_if_mine(self) -> None:
        _HELD_HERE.discard(self.me["id"])
        if not self.lost and (self._read() or {}).get("id") == self.me["id"]:
            try:
                fsutil.delete(self.spark, self.path)
            except Exception as exc:  # noqa: BLE001 - a leftover lease goes stale
                log.warning("could not remove the lease %s: %s", self.path, exc)

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _well_formed(holder: object) -> bool:
    """A lease record: a JSON object whose renewal time is a finite number, whose pid, if
    any, an integer, and whose timeout, if any, a number > 0 (what ``_gone`` and ``_refusal``
    read)."""
    def number(x: object) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if not isinstance(holder, dict):
        return False
    pid, timeout = holder.get("pid", 0), holder.get("timeout", 1)
    return (number(holder.get("renewed")) and isinstance(pid, int) and not isinstance(pid, bool)
            and number(timeout) and timeout > 0)


def _pid_space() -> dict[str, str | None]:
    """This process's pid namespace and the machine's boot (Linux; None elsewhere)."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = None
    return {"pid_ns": ns, "boot_id": boot}


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
