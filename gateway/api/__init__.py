"""The OpenAI-compatible HTTP surface: request parsing, responses, errors."""
