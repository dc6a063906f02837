"""The platform's one way to reach Ray: a cluster (RAY_ADDRESS, as under `ray job submit`, or --address)
or an embedded local Ray started for this process."""

from __future__ import annotations

import os
from typing import Optional

import ray


def init_ray(workers: int, address: Optional[str] = None) -> None:
    """Connect to a cluster (RAY_ADDRESS, as under `ray job submit`, or --address) or start an embedded Ray."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        ray.init(num_cpus=max(workers, os.cpu_count() or 1), include_dashboard=False)
