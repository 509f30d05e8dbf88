from __future__ import annotations

import os
import sys
import tempfile

import pytest

# The tiny models' products are too small for a second torch thread to pay, and on a busy machine
# torch's threads wait for each other (a tiny derive measured 6x slower in CPU time at 2 threads
# than at 1 beside other work): one thread, here and in the processes the tests start, unless the
# caller set OMP_NUM_THREADS.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A GGUF loaded by a test converts into a cache of the suite's own (removed at the end), never the
# user's ~/.cache/leadline; a test of the cache itself points LEADLINE_CACHE at a folder of its own.
os.environ["LEADLINE_CACHE"] = tempfile.mkdtemp(prefix="leadline-cache-")

from helpers import DATA, install_clock, make_model, make_tokenizer

_CACHE = os.environ["LEADLINE_CACHE"]


def pytest_configure(config):
    if "torch" in sys.modules:  # imported before this file (a plugin): the variable came too late
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_unconfigure(config):
    import shutil

    shutil.rmtree(_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA; run on the device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture()
def tiny_model(tokenizer):
    return make_model(vocab_size=len(tokenizer))


@pytest.fixture(scope="session")
def data_dir():
    return DATA


@pytest.fixture()
def fake_clock(monkeypatch):
    """A still clock as the clocks derive reads (helpers.install_clock): time moves only by
    what the test's fake pieces ``advance``."""
    return install_clock(monkeypatch)
