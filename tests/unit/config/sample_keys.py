"""Plain API keys for the config tests: the tenants' keys before `gateway hash-key`."""

from __future__ import annotations

ACME_KEY = "sk-acme-0123456789"
BETA_KEY = "sk-beta-0123456789"
