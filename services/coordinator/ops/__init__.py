"""Operations: everything around the algorithm that keeps runs going and visible.

manager.py runs as tasks of the API process (start, adopt, restart on a lost service); store.py run
state in Redis; lease.py one coordinator per run; recovery.py waiting out service outages;
retention.py old adapters and checkpoints; admission.py what a run may name; clients.py and wire.py
the gRPC clients and their plain types; replicas.py the env and rollout replicas as one; trackers.py,
prometheus.py metrics out.
"""
