"""Read-only views of runs and heads, one module per concern (``headhunt.inspect`` gathers
them for notebooks and the dashboard)."""
