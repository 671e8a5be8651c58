"""Clients for the servers that run the models: Triton over HTTP or gRPC, or OpenAI-compatible."""
