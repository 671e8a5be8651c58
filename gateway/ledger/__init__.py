"""The usage ledger: one record per request, written off the request path in batches.

`usage_records` (the record), `ledger_writer` (the in-memory buffer, the batch flusher,
the on-disk spool for a database outage), `ledger_store` (the store interface and its
choice by URL), `postgres_ledger` and `sqlite_ledger` (the stores), `usage_report` (the
report both stores answer), `ledger_config` (its configuration).
"""
