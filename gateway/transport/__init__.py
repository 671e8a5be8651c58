"""HTTP transport, below every API: the server's guarded protocol, the listeners (API and
ops ports), the directly served routes, and the stream relay (SSE responses that watch
their client)."""
