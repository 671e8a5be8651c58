"""Where work runs: replica choice per request (and, later, placement). Pure: no I/O."""
