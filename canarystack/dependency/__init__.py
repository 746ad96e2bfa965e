"""The model servers' shared dependency: a Redis server, reached through a bounded pool
with timeouts and a circuit breaker (``client``, ``breaker``), and the keys both
variants use (``keys``). A dependency that is slow, full or down degrades an answer (no
retrieved context), never fails or hangs it (issue #16)."""
