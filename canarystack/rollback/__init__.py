"""The rollback executor: takes a tripped release to rolled_back in three idempotent,
resumable steps (docs/ARCHITECTURE.md §5). ``executor`` holds the state machine (one
transition table, decided from the broker's state), ``server`` the HTTP service."""
