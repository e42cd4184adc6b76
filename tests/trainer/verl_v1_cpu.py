"""verl 0.9.1's V1 replay buffer and agent loop worker on a CPU machine, without TransferQueue.

`verl.trainer.ppo.v1`'s `__init__` imports the whole V1 trainer (torchdata, FSDP engine workers);
the modules calcx's training path goes through (`replay_buffer`, `agent_loop_tq`) import
TransferQueue only for its key-value store. `load_v1()` imports those two from verl's own files,
skipping the package `__init__`, under `MemoryKV`: an in-process stand-in for the part of
TransferQueue 0.1.11's KV interface they call, with its semantics (a put merges the new tag into
the key's tag, `kv_list` answers `{partition: {key: tag}}`, `kv_clear` drops keys with their
values). So verl's code, not a copy of it, decides what is sampled and what is evicted.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class KVBatchMeta:
    """TransferQueue's `KVBatchMeta` (keys and their tags, one partition)."""

    keys: list[str] = dataclasses.field(default_factory=list)
    tags: list[dict] = dataclasses.field(default_factory=list)
    partition_id: str | None = None
    fields: list[str] | None = None
    extra_info: dict[str, Any] | None = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.tags):
            raise ValueError(f"keys and tags must have same length, got {len(self.keys)} and {len(self.tags)}")
        if len(self.keys) != len(set(self.keys)):
            raise ValueError("Got duplicated keys.")
        self.tags = copy.deepcopy(self.tags)

    @property
    def size(self) -> int:
        return len(self.keys)


class MemoryKV:
    """Keys -> (tag, fields) per partition; thread-safe (verl's sampler polls from the driver's
    thread while the agent loop worker writes from its event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tags: dict[str, dict[str, dict]] = {}
        self._fields: dict[str, dict[str, Any]] = {}

    def reset(self) -> None:
        with self._lock:
            self._tags.clear()
            self._fields.clear()

    def _put(self, keys: list[str], partition_id: str, fields: Any, tags: list[dict] | None) -> KVBatchMeta:
        if fields is None and tags is None:
            raise ValueError("Please provide at least one parameter of fields or tags.")
        if tags is not None and len(tags) != len(keys):
            raise ValueError(f"{len(tags)} tags for {len(keys)} keys")
        with self._lock:
            partition = self._tags.setdefault(partition_id, {})
            values = self._fields.setdefault(partition_id, {})
            for i, key in enumerate(keys):
                partition.setdefault(key, {}).update(copy.deepcopy(tags[i]) if tags is not None else {})
                if fields is not None:
                    values[key] = fields[i]
            return KVBatchMeta(keys=list(keys), tags=[dict(partition[k]) for k in keys], partition_id=partition_id)

    # -- the TransferQueue functions verl's V1 modules call --
    def init(self, conf: Any = None) -> None:
        return None

    def kv_put(self, key: str, partition_id: str, fields: Any = None, tag: dict | None = None, **_: Any) -> KVBatchMeta:
        return self._put(
            [key], partition_id, [fields] if fields is not None else None, [tag] if tag is not None else None
        )

    def kv_batch_put(
        self, keys: list[str], partition_id: str, fields: Any = None, tags: list[dict] | None = None, **_: Any
    ) -> KVBatchMeta:
        return self._put(list(keys), partition_id, fields, tags)

    async def async_kv_put(
        self, key: str, partition_id: str, fields: Any = None, tag: dict | None = None, **kw: Any
    ) -> KVBatchMeta:
        return self.kv_put(key, partition_id, fields, tag, **kw)

    async def async_kv_batch_put(
        self, keys: list[str], partition_id: str, fields: Any = None, tags: list[dict] | None = None, **kw: Any
    ) -> KVBatchMeta:
        return self.kv_batch_put(keys, partition_id, fields, tags, **kw)

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict]]:
        with self._lock:
            names = [partition_id] if partition_id is not None else list(self._tags)
            return {p: copy.deepcopy(self._tags.get(p, {})) for p in names}

    def kv_clear(self, keys: list[str] | str, partition_id: str) -> None:
        with self._lock:
            for key in [keys] if isinstance(keys, str) else keys:
                self._tags.get(partition_id, {}).pop(key, None)
                self._fields.get(partition_id, {}).pop(key, None)

    # -- for the tests --
    def values(self, partition_id: str, key: str) -> Any:
        with self._lock:
            return self._fields[partition_id][key]

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("transfer_queue")
        mod.__doc__ = "In-memory stand-in for TransferQueue's KV interface (tests only)."
        setattr(mod, "KVBatchMeta", KVBatchMeta)  # noqa: B010 - a module attribute the stub adds
        for name in ("init", "kv_put", "kv_batch_put", "async_kv_put", "async_kv_batch_put", "kv_list", "kv_clear"):
            setattr(mod, name, getattr(self, name))
        return mod


KV = MemoryKV()


def load_v1() -> types.SimpleNamespace:
    """verl's `replay_buffer` and `agent_loop_tq` modules, imported from its files over `KV`.

    Also makes `from verl.trainer.ppo.v1 import AgentLoopManagerTQ` work (calcx.trainer.workers.manager)."""
    sys.modules["transfer_queue"] = KV.module()
    name = "verl.trainer.ppo.v1"
    package = sys.modules.get(name)
    if package is None:
        parent = importlib.util.find_spec("verl.trainer.ppo")
        assert parent is not None and parent.submodule_search_locations, "verl is not installed"
        package = types.ModuleType(name)
        package.__path__ = [str(Path(list(parent.submodule_search_locations)[0]) / "v1")]
        package.__package__ = name
        sys.modules[name] = package
    replay_buffer = importlib.import_module(f"{name}.replay_buffer")
    agent_loop_tq = importlib.import_module(f"{name}.agent_loop_tq")
    for attr in ("AgentLoopManagerTQ", "AgentLoopWorkerTQ"):
        setattr(package, attr, getattr(agent_loop_tq, attr))
    return types.SimpleNamespace(replay_buffer=replay_buffer, agent_loop_tq=agent_loop_tq, kv=KV)
