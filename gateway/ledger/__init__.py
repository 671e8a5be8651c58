"""The usage ledger: one record per request, written off the request path in batches.

`usage_records` (the record), `ledger_writer` (the in-memory buffer and the batch
flusher), `usage_spool` (the on-disk spool that carries records through a database
outage), `ledger_store` (the store interface and its choice by URL), `postgres_ledger`
and `sqlite_ledger` (the stores), `usage_report` (the report both stores answer),
`ledger_config` (its configuration).
"""
