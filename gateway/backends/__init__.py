"""Clients for the servers that run the models: Triton over HTTP or gRPC, or an
OpenAI-compatible server; the pooled HTTP session and Triton's own metrics."""
