"""The foreign stack's Envoy configuration (v3 API), as a plain dict written to JSON.

Routes, first match wins:

1. ``x-canary-variant: canary`` AND the runtime fraction ``routing.pin.canary`` (default
   100 %) -> cluster ``canary``. The fraction is how a rollback turns pins off: at 0 the
   route no longer matches and a pinned request falls through to the weighted route.
2. ``x-canary-variant: baseline`` -> cluster ``baseline``.
3. everything else: weighted clusters baseline 95 / canary 5, each weight overridable live
   under ``routing.llm.<cluster name>`` (``runtime_key_prefix``).
4. only when every weight is 0: the baseline.

With a judge (``judge_port``), the weighted route also mirrors each request to the drift
judge (``python -m canarystack.judge``): ``request_mirror_policies`` to the ``judge``
cluster, fire-and-forget (Envoy drops the mirror's answer and never waits for it), at the
runtime fraction ``routing.mirror.judge`` (default 100 %). Pinned requests are not
mirrored: they are the harness's own oracle pairs, the same prompt to both variants already.

Every answer carries ``x-served-by: baseline|canary``. The HTTP fault filter sits in the
chain with delay and abort configured at 0 %, so it does nothing until a runtime key
(``fault.http.*`` for every request, ``fault.canary.*`` for the canary cluster only) is
set through the admin port's ``/runtime_modify``.

This module must never start anything: it only describes the configuration.
"""

from __future__ import annotations

from typing import Any

HOST = "127.0.0.1"
PIN_HEADER = "x-canary-variant"
SERVED_BY = "x-served-by"
WEIGHT_PREFIX = "routing.llm"
PIN_CANARY_KEY = "routing.pin.canary"
MIRROR_KEY = "routing.mirror.judge"
JUDGE_CLUSTER = "judge"
DEFAULT_WEIGHTS = {"baseline": 95, "canary": 5}
# The fault filter's default runtime keys (apply to every request) and the canary-only
# filter's keys (same meaning, only requests routed to the canary cluster).
FAULT_KEYS_ALL = {
    "delay_percent": "fault.http.delay.fixed_delay_percent",
    "delay_ms": "fault.http.delay.fixed_duration_ms",
    "abort_percent": "fault.http.abort.abort_percent",
    "abort_status": "fault.http.abort.http_status",
}
FAULT_KEYS_CANARY = {
    "delay_percent": "fault.canary.delay.fixed_delay_percent",
    "delay_ms": "fault.canary.delay.fixed_duration_ms",
    "abort_percent": "fault.canary.abort.abort_percent",
    "abort_status": "fault.canary.abort.http_status",
}
# Streams of a slow generation must not be cut: no route timeout; idle limits long
# enough for a stalled-but-alive engine, short enough that dead streams end.
STREAM_IDLE_TIMEOUT = "300s"
CONNECT_TIMEOUT = "2s"


def _served_by(variant: str) -> list[dict[str, Any]]:
    return [
        {
            "header": {"key": SERVED_BY, "value": variant},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    ]


def _fault_filter(name: str, keys: dict[str, str], cluster: str | None) -> dict[str, Any]:
    """A fault filter whose delay and abort exist at 0 % (the runtime keys only override
    a fault that is configured) so it is inert until a key is set."""
    config: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
        "delay": {
            "fixed_delay": "1s",
            "percentage": {"numerator": 0, "denominator": "HUNDRED"},
        },
        "abort": {
            "http_status": 503,
            "percentage": {"numerator": 0, "denominator": "HUNDRED"},
        },
        "delay_percent_runtime": keys["delay_percent"],
        "delay_duration_runtime": keys["delay_ms"],
        "abort_percent_runtime": keys["abort_percent"],
        "abort_http_status_runtime": keys["abort_status"],
    }
    if cluster is not None:
        config["upstream_cluster"] = cluster
    return {"name": name, "typed_config": config}


def _cluster(name: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": CONNECT_TIMEOUT,
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": HOST, "port_value": port}}
                            }
                        }
                    ]
                }
            ],
        },
        # A killed engine is an immediate connection refusal: no retries here (the router
        # would hide the failure the alert must see), the default circuit breakers.
    }


def _pin(variant: str) -> dict[str, Any]:
    return {"name": PIN_HEADER, "string_match": {"exact": variant}}


def _mirror() -> dict[str, Any]:
    """Every weighted request copied to the judge (the runtime key turns it down)."""
    return {
        "request_mirror_policies": [
            {
                "cluster": JUDGE_CLUSTER,
                "runtime_fraction": {
                    "default_value": {"numerator": 100, "denominator": "HUNDRED"},
                    "runtime_key": MIRROR_KEY,
                },
            }
        ]
    }


def render(
    *,
    listen_port: int,
    admin_port: int,
    baseline_port: int,
    canary_port: int,
    judge_port: int | None = None,
) -> dict:
    """The whole bootstrap: listener, admin, the two clusters (and the judge's, with
    ``judge_port``), the runtime layers."""
    no_timeout = {"timeout": "0s", "idle_timeout": STREAM_IDLE_TIMEOUT}
    mirror = _mirror() if judge_port is not None else {}
    routes = [
        {
            "name": "pin-canary",
            "match": {
                "prefix": "/",
                "headers": [_pin("canary")],
                "runtime_fraction": {
                    "default_value": {"numerator": 100, "denominator": "HUNDRED"},
                    "runtime_key": PIN_CANARY_KEY,
                },
            },
            "route": {"cluster": "canary", **no_timeout},
            "response_headers_to_add": _served_by("canary"),
        },
        {
            "name": "pin-baseline",
            "match": {"prefix": "/", "headers": [_pin("baseline")]},
            "route": {"cluster": "baseline", **no_timeout},
            "response_headers_to_add": _served_by("baseline"),
        },
        {
            "name": "weighted",
            "match": {"prefix": "/"},
            "route": {
                "weighted_clusters": {
                    "runtime_key_prefix": WEIGHT_PREFIX,
                    "clusters": [
                        {
                            "name": variant,
                            "weight": weight,
                            "response_headers_to_add": _served_by(variant),
                        }
                        for variant, weight in DEFAULT_WEIGHTS.items()
                    ],
                },
                **no_timeout,
                **mirror,
            },
        },
        # Only reached when every runtime weight is 0: Envoy then logs an ENVOY_BUG ("Sum
        # of weight cannot be zero") and the weighted route matches nothing, which would
        # answer 404. Serving the baseline is what an operator who zeroed both meant.
        {
            "name": "all-weights-zero",
            "match": {"prefix": "/"},
            "route": {"cluster": "baseline", **no_timeout, **mirror},
            "response_headers_to_add": _served_by("baseline"),
        },
    ]
    clusters = [_cluster("baseline", baseline_port), _cluster("canary", canary_port)]
    if judge_port is not None:
        clusters.append(_cluster(JUDGE_CLUSTER, judge_port))
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": "ingress",
        "codec_type": "AUTO",
        "stream_idle_timeout": STREAM_IDLE_TIMEOUT,
        "request_timeout": "0s",
        # The harness sends its own x-request-id; keep it (clients on loopback are not
        # always "internal" to Envoy, which would replace it).
        "preserve_external_request_id": True,
        "route_config": {
            "name": "llm",
            "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            _fault_filter("envoy.filters.http.fault", FAULT_KEYS_ALL, None),
            _fault_filter("fault-canary", FAULT_KEYS_CANARY, "canary"),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    return {
        # Histograms (upstream_rq_time) reach /stats/prometheus only at a stats flush,
        # every 5 s by default: at 1 s the latency alert sees what Prometheus scrapes.
        "stats_flush_interval": "1s",
        "admin": {"address": {"socket_address": {"address": HOST, "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "llm",
                    "address": {"socket_address": {"address": HOST, "port_value": listen_port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
        "layered_runtime": {
            "layers": [
                # The starting values, visible in GET /runtime (observers read weights there).
                {
                    "name": "static",
                    "static_layer": {
                        **{f"{WEIGHT_PREFIX}.{v}": w for v, w in DEFAULT_WEIGHTS.items()},
                        PIN_CANARY_KEY: 100,
                    },
                },
                # What /runtime_modify writes; in memory only, so a restart starts fresh.
                {"name": "admin", "admin_layer": {}},
            ]
        },
    }
