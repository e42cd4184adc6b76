"""The k8s runner's watches: one background thread each for this controller's Jobs and Pods.

Each thread lists, then watches from the list's resourceVersion (re-listing after 410 Gone or an
error, with backoff) and hands every object to `on_object(kind, event, obj)` on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("calcx.controller.k8s")

OnObject = Callable[[str, str, Any], None]


class JobPodWatches:
    """Watches Jobs and Pods matching `selector` in `namespace` until `stopping` is set
    (`stop()` sets it and ends the open streams at once)."""

    KINDS = ("job", "pod")

    def __init__(
        self,
        list_fns: dict[str, Callable[..., Any]],
        namespace: str,
        selector: str,
        *,
        watch_timeout_s: int,
        request_timeout_s: float,
        stopping: threading.Event,
    ) -> None:
        self._list_fns = list_fns
        self._namespace = namespace
        self._selector = selector
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self.stopping = stopping
        self._watches: set[k8s_watch.Watch] = set()
        self._watch_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_object: OnObject | None = None

    def start(self, loop: asyncio.AbstractEventLoop, on_object: OnObject) -> None:
        self._loop = loop
        self._on_object = on_object
        for kind in self.KINDS:
            thread = threading.Thread(
                target=self._watch_forever, args=(kind,), name=f"calcx-k8s-watch-{kind}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Ends every watch stream now; the threads then return."""
        self.stopping.set()
        with self._watch_lock:
            for w in list(self._watches):
                w.stop()

    async def join(self, timeout_s: float = 5.0) -> None:
        for thread in self._threads:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, timeout_s)
        self._threads.clear()

    def _dispatch(self, kind: str, event: str, obj: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._on_object is not None:
            loop.call_soon_threadsafe(self._on_object, kind, event, obj)

    def _watch_forever(self, kind: str) -> None:
        """List, then watch from the list's resourceVersion; re-list after 410 Gone or errors."""
        ns = self._namespace
        list_fn = self._list_fns[kind]
        resource_version: str | None = None
        failures = 0
        while not self.stopping.is_set():
            try:
                if resource_version is None:
                    listed = list_fn(ns, label_selector=self._selector, _request_timeout=self._request_timeout_s)
                    for item in listed.items or []:
                        self._dispatch(kind, "ADDED", item)
                    assert listed.metadata is not None  # the API server always sends it
                    resource_version = listed.metadata.resource_version
                w = k8s_watch.Watch()
                with self._watch_lock:
                    if self.stopping.is_set():
                        return
                    self._watches.add(w)
                try:
                    for event in w.stream(
                        list_fn,
                        ns,
                        label_selector=self._selector,
                        resource_version=resource_version,
                        timeout_seconds=self._watch_timeout_s,
                        _request_timeout=self._watch_timeout_s + 30,
                    ):
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self._dispatch(kind, event["type"], event["object"])
                        if self.stopping.is_set():
                            break
                    resource_version = w.resource_version or resource_version
                finally:
                    with self._watch_lock:
                        self._watches.discard(w)
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    resource_version = None  # history compacted: list again
                    continue
                failures += 1
                log.warning("k8s runner: %s watch failed (%s %s); retrying", kind, exc.status, exc.reason)
                resource_version = None
                self.stopping.wait(min(30.0, 0.5 * 2**failures))
            except Exception as exc:  # noqa: BLE001 - connection resets: back off and re-list
                if self.stopping.is_set():
                    return
                failures += 1
                log.warning("k8s runner: %s watch interrupted (%s); retrying", kind, exc)
                resource_version = None
                self.stopping.wait(min(30.0, 0.5 * 2**failures))
