"""Batch work (issue 44, in progress): the OpenAI Batch API's input files read and checked.
The rest (files, batches, the workers on idle capacity) is docs/design/batches.md's plan."""
