"""``python -m gameday.faultproxy``: the fault proxy (``gameday.faultproxy.cli``)."""

from gameday.faultproxy.cli import fault_proxy_cmd

if __name__ == "__main__":
    fault_proxy_cmd(prog_name="python -m gameday.faultproxy")
