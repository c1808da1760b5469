"""Data-parallel engine replicas on Ray behind one frontend (docs/SCALING.md).

    client.py          DataParallelEngineClient: the app's one EngineClient
    router.py          which replica serves a request (load, prefix affinity)
    replica_client.py  one replica seen from the event loop (ZMQ data plane)
    replica_actor.py   the Ray actor: an engine core on its node
    ray_cluster.py     the only module that imports Ray (lazily, an extra)

Nothing here is imported unless `--data-parallel` is used.
"""
