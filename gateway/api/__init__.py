"""The HTTP surface: OpenAI request parsing, response bodies and SSE chunks, the
handlers, and the mapping of every layer's errors to OpenAI-shaped errors (`errors`).
The only package that knows HTTP; nothing below it imports it."""
