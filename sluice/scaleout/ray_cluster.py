"""Everything sluice asks of Ray, and the only module that imports it.

Ray is an extra (`pip install 'sluice[ray]'`): it is imported here, lazily,
when `--data-parallel` is used, and its absence is one clear error.

- `connect`: join the cluster at `ray_address` ("auto", host:port), or start
  a small local Ray instance (no dashboard, a small object store: only a
  few small values ever go through it).
- `new_replica`: one actor of the replica class (`replica_actor.EngineReplica`,
  which the caller passes: this module imports none of sluice's actors) with
  the replica's resources, spread over the nodes, restarted by Ray when it crashes.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from sluice.config import DataParallelConfig, EngineConfig
from sluice.errors import ModelLoadError

logger = logging.getLogger("sluice.scaleout")

# The object store of a local instance: Ray's floor. Only addresses and
# small results pass through it; the data plane is ZMQ.
LOCAL_OBJECT_STORE_BYTES = 80 << 20


def import_ray() -> Any:
    """The `ray` module, or a ModelLoadError saying how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ModelLoadError(
            "--data-parallel needs Ray, which is not installed: pip install 'sluice[ray]'"
        ) from error
    return ray


def connect(config: DataParallelConfig) -> bool:
    """Join (or start) a Ray cluster; True if this started a local instance."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if config.ray_address is not None:
        ray.init(address=config.ray_address, logging_level=logging.WARNING)
        return False
    needed_cpus = math.ceil(config.num_replicas * config.replica_cpus)
    ray.init(
        num_cpus=max(os.cpu_count() or 1, needed_cpus),
        include_dashboard=False,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        logging_level=logging.WARNING,
    )
    return True


def disconnect() -> None:
    import_ray().shutdown()


def node_ip_address() -> str:
    """The address of the node this process runs on (called inside the actor)."""
    return import_ray().util.get_node_ip_address()


def node_id() -> str:
    """Ray's id of the node this process runs on (called inside the actor)."""
    return import_ray().get_runtime_context().get_node_id()


def new_replica(
    replica_class: type, config: EngineConfig, data_parallel: DataParallelConfig
) -> Any:
    """A new actor of `replica_class` (a handle), made with `config`; it starts
    at once, loading nothing until `serve`."""
    ray = import_ray()
    actor_class = ray.remote(replica_class)
    return actor_class.options(
        num_cpus=data_parallel.replica_cpus,
        num_gpus=data_parallel.replica_gpus,
        max_restarts=data_parallel.max_actor_restarts,
        scheduling_strategy="SPREAD",
    ).remote(config)


def kill(actor: Any, *, restart: bool) -> None:
    """End the actor's process now; with `restart`, Ray starts it again (a crash)."""
    import_ray().kill(actor, no_restart=not restart)


def ray_errors() -> tuple[type[BaseException], ...]:
    """What a call on a dead (or dying) actor raises."""
    return (import_ray().exceptions.RayError,)


def actor_unavailable_error() -> type[BaseException]:
    """What a call raises while Ray restarts the actor (it may succeed later)."""
    return import_ray().exceptions.ActorUnavailableError
