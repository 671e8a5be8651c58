"""Prometheus metrics, JSON logs with redaction, and the one record each request ends in.

A leaf: it reports what others hand it (the running gateway's state through the
`StateSource` the app wires in) and imports none of the packages it observes."""
