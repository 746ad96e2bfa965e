"""``python -m probes``: print this extension's activities in Chaos Toolkit's discovery format.

``chaos discover`` cannot resolve a distribution with several top-level packages (this
project ships ``canarystack``, ``gameday`` and ``probes``), so this is the way to list
them; the output is what ``probes.discover()`` returns.
"""

from __future__ import annotations

import json
import sys

from probes import discover


def main() -> int:
    json.dump(discover(discover_system=False), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
