"""A paired server trial's servers (`sweep.server.ServerSwitch`) under the run plan, without
launching any: with `alternate` pairing only one server runs at a time and `[server] blocks`
blocks cost one launch per switch (4 blocks, the default: A | B B | A A | B B | A, five
launches, each warmed up before it measures); with `together` each is launched once and kept.
The end-to-end sweep with real servers (tests/sweep/test_sweep_server.py) runs fewer blocks."""

from __future__ import annotations

import pytest

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.runner import block_size, plan, run_plan
from specbench.sweep import server as server_mod
from specbench.sweep.spec import build_spec
from specbench.types import Request, Result


class FakeServer:
    """One launched server's backend: answers after no time, logs what it measured."""

    name = "openai"

    def __init__(self, log: list, config_id: str):
        self.log, self.config_id, self.stopped = log, config_id, False

    def run(self, requests, spec, *, concurrency=1, request_rate=None, rate_seed=0, on_results=None):
        assert not self.stopped, "a stopped server was asked to measure"
        self.log.append((self.config_id, "measure" if on_results is not None else "warm-up", [r.id for r in requests]))
        results = [Result(r.id, [1, 2, 3], 0.0, 0.0, [0.001, 0.002, 0.003], "length") for r in requests]
        if on_results is not None:
            on_results(list(zip(requests, results)))
        return results, {"wall_s": 0.01, "steps": 3, "batch_sizes": {"1": 3}}


class FakeLauncher:
    def __init__(self, server: FakeServer, alive: list):
        self.server, self.alive = server, alive
        self.argv, self.log_path = ["serve", "--port", "1"], "log"

    def stop(self):
        self.server.stopped = True
        self.alive.remove(self)


def _switch(monkeypatch, tmp_path, pairing: str, blocks: int | None = None):
    log: list = []
    alive: list = []
    most = [0]

    def start_server(spec, config, session, log_path):
        launcher = FakeLauncher(FakeServer(log, config.config_id), alive)
        alive.append(launcher)
        most[0] = max(most[0], len(alive))
        return launcher, launcher.server

    monkeypatch.setattr(server_mod, "start_server", start_server)
    overrides = {"server.command": "serve --port {port}", "server.pairing": pairing}
    if blocks is not None:
        overrides["server.blocks"] = blocks
    spec = build_spec(overrides)
    return server_mod.ServerSwitch(spec, None, tmp_path, "r"), spec, log, alive, most


def _requests(n: int) -> list[Request]:
    return [Request(id=f"p{i}", prompt_ids=(1, 2), sampling=SamplingParams()) for i in range(n)]


@pytest.mark.parametrize("blocks, launches", [(None, 5), (2, 3), (3, 4)])
def test_alternate_pairing_launches_once_per_switch_and_warms_every_launch(monkeypatch, tmp_path, blocks, launches):
    switch, spec, log, alive, most = _switch(monkeypatch, tmp_path, "alternate", blocks)
    assert spec.server.blocks == (blocks or 4)  # 4 blocks unless told
    configs = plan([SpeculativeConfig(method="ngram", num_speculative_tokens=2)], [2])
    run_plan(switch, _requests(12), configs, run_id="r", warmup=1, blocks=spec.server.blocks, seed=5)
    order = [x["config_id"] for x in switch.launches]
    assert len(order) == launches and set(order) == {"baseline-c2", "ngram-k2-c2"}
    assert all(a != b for a, b in zip(order, order[1:]))  # a launch only where the configuration changes
    assert most[0] == 1  # one server at a time
    # every launch warms up before it measures, then measures whole blocks of 12 / blocks prompts
    size = -(-12 // spec.server.blocks)
    runs = [[]]
    for cid, what, ids in log:
        if what == "warm-up":
            runs.append([cid])
        else:
            assert runs[-1] and runs[-1][0] == cid, log
            runs[-1].append(ids)
    runs = [r for r in runs if r]
    assert [r[0] for r in runs] == order
    # A | B B | A ...: the first and last launch measure one block, those between two
    assert [len(r) - 1 for r in runs] == [1] + [2] * (launches - 2) + [1]
    measured = {cid: [i for r in runs if r[0] == cid for ids in r[1:] for i in ids] for cid in set(order)}
    assert all(sorted(v) == sorted(f"p{i}" for i in range(12)) for v in measured.values())
    assert all(len(ids) <= size for r in runs for ids in r[1:])
    switch.stop()
    assert not alive


def test_together_pairing_launches_each_server_once_and_keeps_both(monkeypatch, tmp_path):
    switch, spec, log, alive, most = _switch(monkeypatch, tmp_path, "together")
    configs = plan([SpeculativeConfig(method="ngram", num_speculative_tokens=2)], [2])
    run_plan(switch, _requests(8), configs, run_id="r", warmup=1, seed=5)
    assert sorted(x["config_id"] for x in switch.launches) == ["baseline-c2", "ngram-k2-c2"]
    assert most[0] == 2 and len(alive) == 2
    assert sum(1 for _, what, _ in log if what == "warm-up") == 2  # each warmed once, blocks interleaved after
    # 8 prompts at concurrency 2: four one-wave blocks in ABBA order, on the servers kept up
    measured = [(cid, ids) for cid, what, ids in log if what == "measure"]
    first, second = measured[0][0], measured[1][0]
    assert first != second and block_size(2) == 2
    assert [cid for cid, _ in measured] == [first, second, second, first] * 2
    assert [ids for _, ids in measured] == [[f"p{i}", f"p{i + 1}"] for i in range(0, 8, 2) for _ in range(2)]
    switch.stop()
    assert not alive
