"""Redis as the gateway uses it: the client by URL (a server, a cluster, or embedded
fakeredis), key helpers, the Lua scripts of `lua/`, and the Idempotency-Key store.
"""
