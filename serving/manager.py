"""`ModelManager`: which version of the model is served (TF Serving's ``ServerCore``).

It polls ``model_base_path`` every ``file_system_poll_wait_seconds`` and serves the
newest integer version on disk that loads. A version that fails to load (a corrupt
``saved_model.pb``, a directory without one) is logged once, kept as an error in the
model's status, and tried again only when its directory changes; the version being
served keeps serving meanwhile. A version directory must be ASCII digits within int64
(TF Serving's versions are int64): one beyond it is never served, and is listed in the
status as ``END`` with INVALID_ARGUMENT. A swap lets requests in flight finish on the
version they started with. During a shutdown (`begin_drain`) the served version is
reported ``UNLOADING``: readiness fails before the ports close.

A served version whose directory is removed is rolled back from, as TF Serving does: the
newest version left on disk that loads is loaded and swapped in (the removed one answers
until then, so that no request fails during the swap), and the status, the
``tfrs_logq_served_version`` metric and requests naming a version follow it. Where no
version left on disk loads (none left, or only broken ones), the removed version is
unloaded, as TF Serving unloads a model whose base path holds no version (the base path
removed too): requests get NOT_FOUND saying the version was removed, readiness
(``/readyz``, gRPC health) fails, the metric has no served version, and the status lists
the removed version as ``END`` with NOT_FOUND (beside the broken ones' errors) until a
version loads again. A base path that is there but cannot be listed (permissions, an I/O
error) changes nothing: what is served keeps serving, and it is logged once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
from typing import Callable, Optional

from tfrs_logq.serving.errors import ServingError, shorten
from tfrs_logq.serving.options import ServerOptions
from tfrs_logq.serving.servable import Servable

log = logging.getLogger("tfrs_logq.serving")

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_VERSION_DIRECTORY = re.compile(r"[0-9]+")  # ASCII only: str.isdigit takes "²" and "١"


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """A version's state as TF Serving's ``ModelVersionStatus`` reports it.

    ``state`` is ``"AVAILABLE"`` (being served), ``"UNLOADING"`` (served, but the
    server is draining) or ``"END"`` (not served; with ``error_code``/``error_message``
    when it failed to load or is out of int64's range).
    """

    version: int
    state: str
    error_code: str = "OK"
    error_message: str = ""


def _fingerprint(path: str) -> tuple:
    """What changes when a version's directory changes: its files' names, sizes, mtimes."""
    entries = []
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            entries.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(entries))


def _error_code(exc: BaseException) -> str:
    """The canonical code of a load failure, as TF Serving reports it in the status."""
    import tensorflow as tf

    if isinstance(exc, tf.errors.OpError):
        return _TF_CODES.get(exc.error_code, "UNKNOWN")
    if isinstance(exc, FileNotFoundError):
        return "NOT_FOUND"
    return "UNKNOWN"


_TF_CODES = {1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 5: "NOT_FOUND",
             7: "PERMISSION_DENIED", 9: "FAILED_PRECONDITION", 13: "INTERNAL",
             15: "DATA_LOSS"}


class ModelManager:
    """Watches ``model_base_path`` and keeps the newest loadable version served.

    Args:
        options: `ServerOptions`.
        load: ``(path, version, options) -> Servable``. Defaults to `Servable`.
    """

    def __init__(self, options: ServerOptions,
                 load: Callable[[str, int, ServerOptions], Servable] = Servable) -> None:
        self.options = options
        self._load = load
        self._servable: Optional[Servable] = None
        self._failed: dict = {}  # version -> (fingerprint, VersionStatus)
        # The served version whose directory was removed with nothing left to load
        # instead (END, NOT_FOUND), reported until a version is served again.
        self._removed: Optional[VersionStatus] = None
        self._unlisted = False  # the base path could not be listed (logged once)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._retired: list = []
        self._listeners: list = []
        self.draining = False
        self.poll()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="tfrs-logq-version-watcher")
        self._thread.start()

    def versions_on_disk(self) -> list[int]:
        """The integer version directories under the base path, oldest first (those
        beyond int64 included: `poll` refuses them); none where it cannot be listed."""
        return self._listing() or []

    def _listing(self) -> Optional[list[int]]:
        """`versions_on_disk`: none where the base path is gone; None where it is there
        but cannot be listed (permissions, an I/O error)."""
        base = self.options.model_base_path
        try:
            names = os.listdir(base)
        except (FileNotFoundError, NotADirectoryError):
            self._unlisted = False
            return []  # gone, with every version in it
        except OSError as exc:
            if not self._unlisted:
                self._unlisted = True
                log.warning("cannot list %s (%s); %s", base, exc,
                            f"still serving version {self._servable.version}"
                            if self._servable is not None else "nothing to serve yet")
            return None
        self._unlisted = False
        return sorted(int(d) for d in names
                      if _VERSION_DIRECTORY.fullmatch(d) and os.path.isdir(os.path.join(base, d)))

    def _refuse_out_of_range(self, versions: list[int]) -> list[int]:
        """Records (once) the versions beyond int64 as not served; returns the others."""
        for version in versions:
            if version <= INT64_MAX or version in self._failed:
                continue
            message = (f"version {shorten(str(version), 24)} is beyond int64 (at most "
                       f"{INT64_MAX}): TF Serving's versions are int64; not served")
            self._failed[version] = (None, VersionStatus(version, "END", "INVALID_ARGUMENT",
                                                         message))
            log.error("%s: %s", self.options.model_name, message)
        return [v for v in versions if v <= INT64_MAX]

    def poll(self) -> None:
        """Serves the newest version on disk that loads, if it is not served already:
        a newer one, or an older one when the served version's directory is gone; the
        served one is unloaded where it is gone and no version left loads."""
        versions = self._listing()
        if versions is None:
            return  # a base path that cannot be listed changes nothing (logged once)
        for version in list(self._failed):
            if version not in versions:
                del self._failed[version]  # removed: nothing to report any more
        if self._removed is not None and self._removed.version in versions:
            self._removed = None  # back on disk: reported as what it is now
        versions = self._refuse_out_of_range(versions)
        current = self._servable
        gone = current is not None and current.version not in versions
        for version in reversed(versions):
            if current is not None and not gone and version <= current.version:
                return  # what is served is the newest that loads
            path = os.path.join(self.options.model_base_path, str(version))
            fingerprint = _fingerprint(path)
            failed = self._failed.get(version)
            if failed is not None and failed[0] == fingerprint:
                continue  # failed before, unchanged since: not again, and not logged again
            try:
                if not os.path.exists(os.path.join(path, "saved_model.pb")):
                    raise FileNotFoundError(f"no saved_model.pb in {path}")
                servable = self._load(path, version, self.options)
            except Exception as exc:  # a broken version must not take the server down
                message = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
                self._failed[version] = (fingerprint, VersionStatus(
                    version, "END", _error_code(exc), message))
                log.error("could not load version %d of %s (%s); %s", version,
                          self.options.model_name, message,
                          f"still serving version {current.version}"
                          if current is not None and not gone else "trying older versions")
                continue
            self._failed.pop(version, None)
            with self._lock:
                old, self._servable = self._servable, servable
            self._removed = None
            if gone:
                log.warning("version %d of %s was removed from %s; rolled back to version %d",
                            current.version, self.options.model_name,
                            self.options.model_base_path, version)
            log.info("serving %s version %d", self.options.model_name, version)
            self._notify()
            if old is not None:
                self._retire(old)
            return
        if gone:
            self._unload(current)

    def _unload(self, removed: Servable) -> None:
        """The served version's directory is gone and no version left loads: nothing is
        served, and the status says why."""
        message = (f"version {removed.version} was removed from the base path and no "
                   "version left there loads: nothing is served")
        with self._lock:
            if self._servable is not removed:
                return
            self._servable = None
        self._removed = VersionStatus(removed.version, "END", "NOT_FOUND", message)
        log.error("%s: %s (%s)", self.options.model_name, message,
                  self.options.model_base_path)
        self._notify()
        self._retire(removed)

    def _retire(self, old: Servable) -> None:
        """Requests already holding ``old`` finish on it; its batchers stop later."""
        timer = threading.Timer(30.0, old.close)
        timer.daemon = True
        timer.start()
        # Kept to close them at stop(); those already closed are let go.
        self._retired = [(t, s) for t, s in self._retired if t.is_alive()]
        self._retired.append((timer, old))

    def _watch(self) -> None:
        wait = max(0.05, self.options.file_system_poll_wait_seconds)
        while not self._stop.wait(wait):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 (the watcher must keep watching)
                log.exception("polling %s failed", self.options.model_base_path)

    def _check_name(self, model_name: str, version: Optional[int]) -> None:
        if model_name != self.options.model_name:
            raise _not_found(model_name, version)

    def get(self, model_name: str, version: Optional[int] = None) -> Servable:
        """The servable for a request; NOT_FOUND for another name or version."""
        self._check_name(model_name, version)
        servable = self._servable
        if servable is None:
            raise _not_found(model_name, None, self._why_none())
        if version is not None and version != servable.version:
            raise _not_found(model_name, version)
        return servable

    def begin_drain(self) -> None:
        """The server is shutting down: the served version reports ``UNLOADING``."""
        self.draining = True
        self._notify()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Calls ``listener()`` now and whenever readiness may change (a version swapped
        in, the drain begun): the gRPC health service follows the manager so."""
        self._listeners.append(listener)
        listener()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # noqa: BLE001  (a listener must not stop a swap or a drain)
                log.exception("a readiness listener failed")

    def current(self) -> Optional[Servable]:
        """The version served now, or None before one loads."""
        return self._servable

    def statuses(self) -> list[VersionStatus]:
        """Every version's state, newest first (empty when there is none to report)."""
        try:
            return self.status(self.options.model_name)
        except ServingError:
            return []

    def ready(self) -> bool:
        """A version is served and the server is not draining (readiness)."""
        return self._servable is not None and not self.draining

    def status(self, model_name: str, version: Optional[int] = None) -> list[VersionStatus]:
        """The versions' states, newest first: the one served (AVAILABLE) and those that
        failed to load (END, with their error); where nothing is served because the served
        version was removed, that version (END, NOT_FOUND). NOT_FOUND when there is none to
        report."""
        self._check_name(model_name, version)
        servable = self._servable
        out = [failed for _, failed in list(self._failed.values())]  # poll() may change it
        removed = self._removed
        if removed is not None and servable is None:
            out.append(removed)
        if servable is not None:
            out.append(VersionStatus(servable.version,
                                     "UNLOADING" if self.draining else "AVAILABLE"))
        out.sort(key=lambda s: -s.version)
        if version is not None:
            out = [s for s in out if s.version == version]
        if not out:
            raise _not_found(model_name, version, self._why_none() if version is None else "")
        return out

    def _why_none(self) -> str:
        """Why no version is served, as NOT_FOUND's message ends."""
        removed = self._removed
        if removed is not None and self._servable is None:
            return f": version {removed.version} was removed and no version on disk loads"
        return ": no version loaded yet"

    def stop(self) -> None:
        """Stops watching; with the servables' batch workers."""
        self._stop.set()
        for timer, old in self._retired:
            timer.cancel()
            old.close()
        if self._servable is not None:
            self._servable.close()


def _not_found(model_name: str, version: Optional[int], why: str = "") -> ServingError:
    """TF Serving's NOT_FOUND words, the name cut short (a 100 KB name is not echoed)."""
    name = model_name if model_name.isprintable() and len(model_name) <= 64 \
        else shorten(model_name)
    which = f"Latest({name})" if version is None else f"Specific({name}, {version})"
    return ServingError("NOT_FOUND", f"Servable not found for request: {which}{why}")


__all__ = ["INT64_MAX", "INT64_MIN", "ModelManager", "VersionStatus"]
