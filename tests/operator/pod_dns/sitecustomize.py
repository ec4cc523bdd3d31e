"""TEST CODE: cluster DNS for the processes the test node agent runs (tests/operator/node_agent.py).

Pods there are local processes sharing 127.0.0.1, each containerPort mapped to a free local port.
Python imports this module at start when its folder is on PYTHONPATH (the agent puts it there):
names under `.svc` (pod DNS names of headless Services, `<pod>.<service>.<namespace>.svc`) resolve
to 127.0.0.1 with the port mapped as the agent wrote in $KEYRANGE_TEST_POD_DNS (a JSON file:
name -> {containerPort: localPort}). Every other name resolves as usual.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

_resolve = socket.getaddrinfo


def _getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    name = host.decode() if isinstance(host, bytes) else str(host or "")
    path = os.environ.get("KEYRANGE_TEST_POD_DNS")
    if path and (name.endswith(".svc") or name.endswith(".svc.cluster.local")):
        try:
            with open(path, encoding="utf-8") as table:
                ports = json.load(table).get(name.removesuffix(".cluster.local"))
        except (OSError, ValueError):
            ports = None
        if ports is not None:
            mapped = ports.get(str(port), port)
            return _resolve("127.0.0.1", mapped, *args, **kwargs)
    return _resolve(host, port, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
