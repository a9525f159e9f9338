import os
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # oracle.py

# Suites that must run, not skip, wherever their frameworks are importable, and always with
# BLASST_REQUIRE_TORCH=1 (scripts/test_python.sh installs torch, transformers and diffusers and
# sets it):
# their CPU tests run on CPU tensors through the reference engine, so a skip there hides a broken
# install or a broken import, not a missing GPU. GPU tests (marker "gpu") inside them may skip on a
# machine without a GPU; with BLASST_REQUIRE_GPU=1 (scripts/device_python.sh, device_all.sh) a
# skipped GPU test anywhere is a failure.
REQUIRED_SUITES = {"test_torch.py": ("torch",), "test_backward_cpu.py": ("torch",),
                   "test_torch_eager_cpu.py": ("torch",), "test_transformers.py": ("torch", "transformers"),
                   "test_diffusers_cpu.py": ("torch", "diffusers"),
                   "test_diffusers_gpu.py": ("torch", "diffusers")}
REQUIRE_TORCH = os.environ.get("BLASST_REQUIRE_TORCH") == "1"
REQUIRE_GPU = os.environ.get("BLASST_REQUIRE_GPU") == "1"
# Multi-GPU tests (marker "multigpu") skip on machines with fewer GPUs, also under
# BLASST_REQUIRE_GPU=1 (the one-GPU device runs); BLASST_REQUIRE_GPUS=2 (or more) makes their skip a
# failure (scripts/device_multi_gpu.sh).
REQUIRE_GPUS = int(os.environ.get("BLASST_REQUIRE_GPUS", "0") or 0)

_outcomes = {}  # file name -> Counter of passed / failed / skipped


def _importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def _suite_required(filename: str) -> bool:
    needs = REQUIRED_SUITES.get(filename)
    if needs is None:
        return False
    return REQUIRE_TORCH or all(_importable(n) for n in needs)


def _why_required(filename: str) -> str:
    if REQUIRE_TORCH:
        return ("BLASST_REQUIRE_TORCH=1: scripts/test_python.sh installs torch, transformers and "
                "diffusers")
    return f"{' and '.join(REQUIRED_SUITES[filename])} importable here"


def pytest_report_header(config):
    try:
        import blasst
        line = (f"blasst {blasst.__version__} from {os.path.dirname(blasst.__file__)}; "
                f"built with CUDA: {blasst.built_with_cuda()}; GPU usable: {blasst.cuda_available()}")
    except Exception as e:  # noqa: BLE001 - the header only reports
        line = f"blasst not importable: {e}"
    return [line, f"required suites: {sorted(REQUIRED_SUITES)} (BLASST_REQUIRE_TORCH="
                  f"{int(REQUIRE_TORCH)}), BLASST_REQUIRE_GPU={int(REQUIRE_GPU)}, "
                  f"BLASST_REQUIRE_GPUS={REQUIRE_GPUS}"]


_skipped_suites = []  # (file name, reason): required suites skipped as a whole


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A required suite skipped as a whole (pytest.importorskip at module level) is recorded and
    fails the session at its end (the other files still run)."""
    outcome = yield
    report = outcome.get_result()
    if not isinstance(collector, pytest.Module) or not report.skipped:
        return
    name = os.path.basename(str(collector.path))
    if _suite_required(name):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped_suites.append((name, reason))
        _outcomes.setdefault(name, Counter())["skipped whole suite"] += 1


def pytest_sessionfinish(session, exitstatus):
    if _skipped_suites and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped CPU test of a required suite, or with BLASST_REQUIRE_GPU=1 a skipped GPU test,
    is reported as a failure naming the rule and the original reason."""
    outcome = yield
    report = outcome.get_result()
    name = os.path.basename(str(item.path))
    if report.skipped and not hasattr(report, "wasxfail"):
        is_gpu = item.get_closest_marker("gpu") is not None
        is_multi = item.get_closest_marker("multigpu") is not None
        rule = None
        if is_multi:
            if REQUIRE_GPUS >= 2:
                rule = f"BLASST_REQUIRE_GPUS={REQUIRE_GPUS}: a multi-GPU test must run"
        elif is_gpu and REQUIRE_GPU:
            rule = "BLASST_REQUIRE_GPU=1: a GPU test must run"
        elif not is_gpu and _suite_required(name):
            rule = f"{name} must run on CPU ({_why_required(name)})"
        if rule is not None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            report.outcome = "failed"
            report.longrepr = f"{rule}, but it skipped: {reason}"
    if report.when == "call" or report.outcome != "passed":
        _outcomes.setdefault(name, Counter())[report.outcome] += 1


def pytest_terminal_summary(terminalreporter):
    """How many tests of each file ran, passed, failed and skipped."""
    tr = terminalreporter
    tr.section("blasst: tests per file")
    total = Counter()
    for name in sorted(_outcomes):
        c = _outcomes[name]
        total.update(c)
        tr.write_line(f"{name:28s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    tr.write_line(f"{'all files':28s} " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
    for name, reason in _skipped_suites:
        tr.write_line(f"FAILED: {name} must run ({_why_required(name)}) but was skipped as a "
                      f"whole: {reason}", red=True)


@pytest.fixture(autouse=True)
def _reset_gate():
    import blasst
    blasst.diffusion.reset()
    yield
    blasst.diffusion.reset()


def gpu_problem():
    """Why the GPU tests cannot run here (torch, a CUDA device, blasst's kernels, an sm_90 GPU), or
    None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    import blasst
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if not blasst.built_with_cuda():
        return "blasst was built without the CUDA kernels (BLASST_ENABLE_CUDA=OFF or no nvcc)"
    if not blasst.cuda_available():
        return "blasst sees no usable sm_90 GPU"
    return None


@pytest.fixture
def cuda():
    """torch's CUDA device for a GPU test; the test skips with the reason where there is none, and
    fails instead with BLASST_REQUIRE_GPU=1."""
    problem = gpu_problem()
    if problem is not None:
        if REQUIRE_GPU:
            pytest.fail(f"BLASST_REQUIRE_GPU=1 but {problem}")
        pytest.skip(f"GPU test: {problem}")
    import torch
    return torch.device("cuda")


@pytest.fixture
def gen(request):
    """A torch generator seeded from the test's name (fresh data per test, reproducible)."""
    import torch
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**31)
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def rng(request):
    import numpy as np
    # Fresh data per test, reproducible from the test's name.
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
