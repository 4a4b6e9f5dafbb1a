"""Sweeps across servers: with a `[server]` section, each trial launches its own inference
server (vLLM, SGLang, `specbench serve`) from the command template, for that trial's
configuration, on a free loopback port; waits until it serves; measures through the openai
backend; and stops it, also when the trial fails.

Only the tokenizer is loaded here (`[server] tokenizer`, default the target): the servers
hold the weights. Placeholders of the template (see `options.SERVER_PLACEHOLDERS`):

    {target} {draft}: the models as the spec names them; a catalog name or a .gguf file
        becomes its converted Hugging Face directory (what vLLM and SGLang can load)
    {method} {k} (= {num_speculative_tokens}) {k_plus_1} {port} {python}
    {topk} {num_draft_tokens}: SGLang's --speculative-eagle-topk and
        --speculative-num-draft-tokens for the trial (a chain: 1 and k + 1)
    {dtype}: [models] dtype (auto | bfloat16 | float16 | float32, the same words vLLM,
        SGLang and `specbench serve` take for --dtype)
    {speculative_config_json}: vLLM's --speculative-config JSON for the trial
        ({} for the baseline, else `serving.vllm_speculative_config`: {"method": "draft_model",
         "model": DRAFT, "num_speculative_tokens": K} for draft_model, the same with "eagle3"
         and the head's directory for eagle3, {"method": "ngram", "num_speculative_tokens": K,
         "prompt_lookup_min": 1, "prompt_lookup_max": 4} for ngram, the sizes measured)

A speculative trial is paired in time with a baseline server (`[server] pairing`,
`ServerSwitch`): `alternate` (the default) launches the trial's server and a baseline server
in turn block by block (`[server] blocks`, 4 by default: A | B B | A A | B B | A, five
launches, each warmed up), so each is measured before and after the other and the paired
interval, whose unit is the block, has blocks to count; `together` starts both at once on two ports and
alternates ABBA blocks between them; `none` measures the configuration alone, compared later
with the baseline trial.

Boundary: launching, connecting to and checking one trial's servers (`backends.launcher`,
`backends.openai`); the measurement itself is `specbench.sweep.measure`'s.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from specbench.config import SpeculativeConfig
from specbench.errors import BackendError, ConfigError
from specbench.runner import BackendSwitch, Configuration
from specbench.sweep.options import label as label_of
from specbench.sweep.serving import vllm_speculative_config
from specbench.sweep.spec import SweepSpec
from specbench.sweep.storage import first_line
from specbench.sweep.trials import TrialFailed
from specbench.models import catalog, fetch
from specbench.session import default_num_prompts
from specbench.workload import build_requests, load_workload


def speculative_config_json(spec: SpeculativeConfig) -> str:
    """vLLM's --speculative-config for `spec` ({} for the baseline)."""
    if not spec.speculative:
        return "{}"
    return json.dumps(vllm_speculative_config(spec.method, spec.draft, spec.num_speculative_tokens))


def server_model_path(model: str) -> str:
    """`model` as a server loads it: catalog names and .gguf files become their converted
    Hugging Face directory, a catalog head its unpacked directory (pulled or converted on first
    use, as `specbench run` does); anything else (a directory, a hub id the server resolves
    itself) stays as given."""
    from specbench.models.loading import resolve_model_path

    if fetch.named_head(model) is not None:
        return str(fetch.pull(model))
    if catalog.is_catalog_name(model) or (model.lower().endswith(".gguf") and Path(model).expanduser().is_file()):
        return str(resolve_model_path(model))
    return model


def trial_params(spec: SweepSpec, config: Configuration, port: int) -> dict[str, Any]:
    """Values of the template's placeholders for `config`."""
    sc = config.spec
    draft = server_model_path(sc.draft) if sc.draft else ""
    sc = replace(sc, draft=draft or None)  # as the server loads it
    return {"target": server_model_path(spec.target), "draft": draft, "method": sc.method,
            "k": sc.num_speculative_tokens, "num_speculative_tokens": sc.num_speculative_tokens,
            "k_plus_1": sc.num_speculative_tokens + 1,  # SGLang chain: num_draft_tokens = steps + 1
            # SGLang's tree flags: --speculative-eagle-topk, --speculative-num-draft-tokens (a
            # chain's: 1 and k + 1; the baseline's: 1 and 1)
            "topk": sc.topk, "num_draft_tokens": sc.verify_width,
            "port": port, "speculative_config_json": speculative_config_json(sc),
            "python": sys.executable, "dtype": spec.engine.dtype}


@dataclass
class ServerSession:
    """What a sweep across servers needs locally: the tokenizer and the tokenized requests."""

    tokenizer: Any  # specbench.backends.openai.TokenizerOnly
    requests: list
    workload: Any
    skipped: int = 0
    log: Callable[[str], None] | None = None
    dtype_name: str | None = None


def open_server_session(spec: SweepSpec, log: Callable[[str], None] | None = None) -> ServerSession:
    """Load the workload and the tokenizer (never the weights), tokenize the requests."""
    from specbench.backends.openai import OpenAIBackend, load_tokenizer

    assert spec.server is not None
    w = spec.workload
    wl = load_workload(w.source, prompt_field=w.prompt_field,
                       num_prompts=w.num_prompts if w.num_prompts is not None else default_num_prompts(w.source),
                       seed=spec.sampling.seed)
    source = spec.server.tokenizer or spec.target
    tok = load_tokenizer(source, OpenAIBackend("", spec.target), trust_remote_code=spec.engine.trust_remote_code)
    if log:
        log(f"tokenizer [bold]{tok.name}[/]; servers launched from the server command; pairing: {spec.pairing}")
    requests, skipped = build_requests(wl, tok.tokenizer, spec.sampling.params(), use_chat_template=w.chat_template,
                                       max_context=tok.max_context, truncate=w.truncate,
                                       overrides=spec.sampling.overrides, tool_call_parser=w.tool_call_parser)
    if not requests:
        raise ConfigError(f"every prompt of {wl.name!r} is longer than the context of "
                          f"{tok.max_context} tokens (use --truncate to keep them)")
    return ServerSession(tokenizer=tok, requests=requests, workload=wl, skipped=skipped, log=log)


def start_server(spec: SweepSpec, config: Configuration, session: ServerSession,
                 log_path: Path) -> tuple[Any, Any]:
    """Launch the trial's server and connect to it: (ServerLauncher, prepared OpenAIBackend).
    The server is stopped again when anything here fails."""
    from specbench.backends.launcher import ServerLauncher, free_port
    from specbench.backends.openai import OpenAIBackend

    srv = spec.server
    assert srv is not None
    base_template = srv.base_url
    parsed = urlparse(base_template.replace("{port}", "1"))
    host = parsed.hostname or "127.0.0.1"
    port = free_port("127.0.0.1")
    base_url = base_template.replace("{port}", str(port))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    launcher = ServerLauncher(srv.template(config.is_baseline), trial_params(spec, config, port),
                              host=host if host in ("127.0.0.1", "localhost", "::1") else "127.0.0.1",
                              ready_timeout_s=srv.ready_timeout_s, log_path=log_path)
    if session.log:
        session.log(f"starting server: {shlex.join(launcher.argv)}")
    try:
        if "{port}" not in base_template and host in ("127.0.0.1", "localhost", "::1"):
            # A fixed port someone else holds: readiness would be answered by *their* server.
            fixed = urlparse(base_url).port or (443 if parsed.scheme == "https" else 80)
            if port_in_use(host, fixed):
                raise BackendError(f"port {fixed} of {host} ({label_of('server.base_url')}) is already in use "
                                   "by another process: stop it, or use {port} in the URL and the command")
        launcher.start()
        backend = OpenAIBackend.connect(base_url, endpoint=srv.endpoint)
        # the server must run the trial's configuration (its card / counters say so)
        sc = config.spec
        backend.server_spec(sc.method, [sc.num_speculative_tokens], sc.draft, (sc.ngram_min, sc.ngram_max),
                            declared=True)
        tok = session.tokenizer
        backend.prepare(session.requests[0], tok.tokenizer, tok.eos_token_ids)
        if launcher.proc is None or launcher.proc.poll() is not None:  # something else answered
            raise BackendError(f"the server exited (code {launcher.exit_code()}) although {base_url} answered: "
                               f"another process holds that port; log {launcher.log_path}")
    except (KeyboardInterrupt, SystemExit):
        launcher.stop()
        raise
    except BaseException as exc:  # noqa: BLE001 - every way a server fails is this trial's reason
        launcher.stop()
        raise TrialFailed(f"server failed: {first_line(exc)}") from None
    return launcher, WatchedBackend(backend, launcher)


class ServerSwitch(BackendSwitch):
    """The servers of one paired server trial, one per configuration (the baseline and the
    trial's), for `runner.run_plan`. `alternate`: at most one runs; asking for the other
    stops it and launches the one asked for (fresh, so the plan warms it up). `together`:
    each is launched on first use and kept. `stop()` stops whatever runs; `launches` lists
    (config_id, command, log) in launch order, what the trial's run.json records."""

    name = "openai"

    def __init__(self, spec: SweepSpec, session: ServerSession, log_dir: Path, run_id: str):
        assert spec.server is not None
        self.spec, self.session = spec, session
        self.log_dir, self.run_id = log_dir, run_id
        self.together = spec.server.pairing == "together"
        self.running: dict[str, tuple[Any, Any]] = {}  # config_id -> (launcher, backend)
        self.launches: list[dict[str, str]] = []
        self.last: Any = None  # the backend measured last (describe(), device_name)

    def get(self, config: Configuration) -> tuple[Any, bool]:
        cid = config.config_id
        if cid in self.running:
            self.last = self.running[cid][1]
            return self.last, False
        if not self.together:
            self.stop()
        n = len(self.launches)
        log = self.log_dir / f"{self.run_id}-{n}-{'baseline' if config.is_baseline else 'speculative'}.log"
        launcher, backend = start_server(self.spec, config, self.session, log)
        self.running[cid] = (launcher, backend)
        self.launches.append({"config_id": cid, "command": shlex.join(launcher.argv), "log": str(launcher.log_path)})
        self.last = backend
        return backend, True

    def stop(self) -> None:
        for launcher, _ in self.running.values():
            launcher.stop()
        self.running.clear()


def port_in_use(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class WatchedBackend:
    """The trial's openai backend, with its server watched: when the server process is gone
    after a run, the trial fails as `server failed: exited with code N during the trial`
    instead of being recorded with a wave of connection errors as its measurement."""

    def __init__(self, backend: Any, launcher: Any) -> None:
        self._backend, self._launcher = backend, launcher

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def _check(self) -> None:
        proc = self._launcher.proc
        code = proc.poll() if proc is not None else None
        if code is not None:
            tail = self._launcher.log_tail(3).replace("\n", " | ")
            raise TrialFailed(f"server failed: exited with code {code} during the trial; log "
                              f"{self._launcher.log_path}: {tail[-300:]!r}")

    def run(self, *args: Any, **kwargs: Any) -> Any:
        out = self._backend.run(*args, **kwargs)
        self._check()
        return out

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        out = self._backend.generate(*args, **kwargs)
        self._check()
        return out
