"""Parts every canarystack component shares: the base HTTP app (/health, /metrics,
/admin/faults), fault registry with TTLs, admin-token auth, JSON logs, CLI options,
JSON error responses and prompt-length buckets.

Nothing here knows about a specific component."""
