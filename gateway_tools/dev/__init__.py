"""For development and tests, never on the request path: the local process stack
(`processes`: free ports, redis-server, spawning and stopping), `gateway demo`, and the
Triton simulator (`sim`).
"""
