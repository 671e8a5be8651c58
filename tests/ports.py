"""Where each kind of test server looks for a free port.

Every range lies below Linux's ephemeral range (32768-60999 by default): a port
picked there can be taken by any outgoing connection between the moment it was
found free and the moment the server binds it. Each kind keeps to its own range, so
a port picked for one kind is never taken by a server of another kind meanwhile.
"""

SIMS = 10000  # triton-sim servers: HTTP, gRPC and metrics on P, P+1, P+2
MCP_SERVERS = 7000  # the tests' own MCP servers over HTTP (up to 7900)
GATEWAYS = 14000
CLUSTER_NODES = 16000  # Redis Cluster nodes; their bus ports lie 10000 above
PROMETHEUS = 18000
OWN_REDIS = 19000  # a test's private redis-server it stops and restarts
REDIS = 20000  # the session's redis-server (gateway_tools.dev.processes.free_port's default)
SENTINEL_GROUPS = 24000  # a primary, its replica and three sentinels on P .. P+4
DNS_SERVERS = 28500  # the tests' own authoritative DNS servers (UDP and TCP on one port)
FAILING_UPSTREAMS = 29000  # one range of 1000 per upstream
COLLECTORS = 32000  # the tests' OTLP receivers (HTTP, gRPC) and silent collectors
