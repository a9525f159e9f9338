import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # oracle.py


def pytest_report_header(config):
    try:
        import blasst
        return (f"blasst {blasst.__version__} from {os.path.dirname(blasst.__file__)}; "
                f"built with CUDA: {blasst.built_with_cuda()}; GPU usable: {blasst.cuda_available()}")
    except Exception as e:  # noqa: BLE001 - the header only reports
        return f"blasst not importable: {e}"


@pytest.fixture(autouse=True)
def _reset_gate():
    import blasst
    blasst.diffusion.reset()
    yield
    blasst.diffusion.reset()


@pytest.fixture
def rng(request):
    import numpy as np
    # Fresh data per test, reproducible from the test's name.
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
