"""State shared by gateway replicas through Redis (`state: {url: ...}`): the link to Redis and
whether it is up (`link.py`), and callers' rpm/tpm buckets reserved and settled by Lua scripts
(`limits.py`). docs/scale-out.md says what holds across replicas."""
