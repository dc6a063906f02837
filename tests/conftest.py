import subprocess
import sys
from pathlib import Path

import pytest
import torch

from envs.instance import Instance


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


ROOT = Path(__file__).resolve().parent.parent


def run_script(name: str, *args, check: bool = False) -> subprocess.CompletedProcess:
    """Run platform/<name> with the test interpreter, as a user would from the command line."""
    result = subprocess.run([sys.executable, str(ROOT / "platform" / name), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr[-2000:]
    return result


def single_item(lead: int, lam: float = 2.0, h: float = 1.0, b: float = 10.0, K: float = 5.0, qbar: float = 12.0) -> Instance:
    return Instance(h=[h], b=[b], lam=[lam], beta=[0.0], lead=[lead], qbar=[qbar], K=K, gamma=0.9, rho=0.5)


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole test session, started and bound as the scripts start theirs."""
    import ray

    from solver_workers.ray_session import start_local_ray

    start_local_ray(2, log_to_driver=False)
    yield ray
    ray.shutdown()
