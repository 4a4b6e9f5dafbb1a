"""The `server` fixture of the `specbench serve` tests: the server on the tiny pair, started as
a sweep starts vLLM (`ServerLauncher`, a free loopback port, `python -m specbench.server`),
once per test module, with that module's `SERVE_FLAGS` added to the command line."""

from __future__ import annotations

import os
import sys

import pytest

from specbench.backends.launcher import ServerLauncher

SERVE = ("{python} -m specbench.server --target {target} --draft {draft} -k 3 --dtype float32 "
         "--device cpu --port {port} --served-model-name tiny")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def server(request, tiny_pair, tmp_path_factory):
    flags = getattr(request.module, "SERVE_FLAGS", "")
    launcher = ServerLauncher(f"{SERVE} {flags}".strip(),
                              {"python": sys.executable, "target": tiny_pair[0], "draft": tiny_pair[1]},
                              ready_timeout_s=180, env=ENV, log_path=tmp_path_factory.mktemp("server") / "server.log")
    launcher.start()
    yield launcher
    launcher.stop()
