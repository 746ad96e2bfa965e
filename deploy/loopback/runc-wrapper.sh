#!/bin/sh
# The runtime containerd calls instead of runc, for the loopback cluster only. Some sandboxes
# (this one included) lack CAP_SYS_RESOURCE, so the negative oom_score_adj the kubelet gives
# to pod sandboxes (-998) and Guaranteed pods (-997) cannot be set and every pod would fail
# to start. Clamp it to 0 in the OCI bundle, then run Debian's runc unchanged.
prev=""
bundle=""
for a in "$@"; do
    case "$prev" in --bundle | -b) bundle="$a" ;; esac
    case "$a" in --bundle=*) bundle="${a#--bundle=}" ;; esac
    prev="$a"
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    jq -c '(if (.process.oomScoreAdj // 0) < 0 then .process.oomScoreAdj = 0 else . end)' \
        "$bundle/config.json" >"$bundle/config.json.tmp" &&
        mv "$bundle/config.json.tmp" "$bundle/config.json"
fi
exec /usr/bin/runc "$@"
