"""`specbench serve`: the embedded engine behind an OpenAI-compatible streaming API, so
`specbench run --backend openai` (or any OpenAI client) can talk to it like to vLLM.

The command only parses and checks its flags; `specbench.session.open_engine` loads the models
into an engine and `specbench.server.SpecbenchServer` serves it. `main()` is `python -m
specbench.server`."""

from __future__ import annotations

import math
import signal
import sys
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from specbench.config import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_TARGET,
    EngineConfig,
    SpeculativeConfig,
    default_draft,
    parse_speculative_config,
)
from specbench.errors import ConfigError
from specbench.flags import HELP
from specbench.server import SpecbenchServer, is_loopback
from specbench.session import open_engine

console = Console(stderr=True)


def resolve_spec(target: str, draft: str | None, method: str | None, k: int,
                 speculative_config: str | None) -> SpeculativeConfig:
    """As vLLM: no speculation unless --speculative-config, --method or --draft asks for it."""
    if speculative_config:
        return parse_speculative_config(speculative_config)
    method = method or ("draft_model" if draft else "none")
    return SpeculativeConfig.for_method(method, k, default_draft(target, method, draft))


def _check_can_listen(host: str, port: int) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
            s.bind((host, port))
    except OSError as exc:
        raise ConfigError(f"--host {host} --port {port}: cannot listen ({exc.strerror or exc})") from None


def serve(
    target: Annotated[str, typer.Option(help=HELP["target"])] = DEFAULT_TARGET,
    draft: Annotated[Optional[str], typer.Option(help="Draft model (implies --method draft_model), or with --method eagle3 the EAGLE-3 head's directory or a catalog head (default on the default target: its catalog head), with --method medusa the Medusa heads' directory.")] = None,
    method: Annotated[Optional[str], typer.Option(help="none | draft_model | ngram | eagle3 | medusa | suffix (default: none, or draft_model with --draft; suffix decoding's knobs: --speculative-config).")] = None,
    num_speculative_tokens: Annotated[int, typer.Option("--num-speculative-tokens", "-k", help="Draft tokens per step.")] = DEFAULT_NUM_SPECULATIVE_TOKENS,
    speculative_config: Annotated[Optional[str], typer.Option(help=HELP["speculative_config"])] = None,
    device: Annotated[str, typer.Option(help=HELP["device"])] = "auto",
    dtype: Annotated[str, typer.Option(help=HELP["dtype"])] = "auto",
    onednn: Annotated[str, typer.Option("--onednn", help=HELP["onednn"])] = "auto",
    capture: Annotated[str, typer.Option("--capture", help=HELP["capture"])] = "auto",
    trust_remote_code: Annotated[bool, typer.Option(help=HELP["trust_remote_code"])] = False,
    host: Annotated[str, typer.Option(help="Address to listen on; loopback by default (the API has no authentication).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 = any free port; the chosen one is printed).")] = 8000,
    max_concurrency: Annotated[int, typer.Option(help="Requests admitted at once (decoding + waiting); more get HTTP 429.")] = 64,
    max_num_seqs: Annotated[Optional[int], typer.Option(help="Requests decoded together in one batch (continuous batching); default: --max-concurrency.")] = None,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name in the API (default: --target as given).")] = None,
    log_requests: Annotated[bool, typer.Option(help="Log every HTTP request to stderr.")] = False,
    read_timeout: Annotated[float, typer.Option(help="Seconds a request (line, headers, body) may take to arrive from its first byte, and an idle keep-alive connection may wait; then 408 or close.")] = 30.0,
) -> None:
    """Serve the embedded engine over an OpenAI-compatible API (/v1/completions,
    /v1/chat/completions, /v1/models, /health, /metrics) with continuous batching."""

    if method is not None and not method.strip():
        raise ConfigError("--method is empty: give one of none, draft_model, ngram, eagle3, medusa, suffix, "
                          "or leave it out")
    if speculative_config is not None and not speculative_config.strip():
        raise ConfigError("--speculative-config is empty: give a JSON object, e.g. "
                          "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}', or leave it out")
    if served_model_name is not None and (not served_model_name.strip()
                                          or any(not c.isprintable() for c in served_model_name)):
        raise ConfigError(f"--served-model-name {served_model_name!r}: give a name of printable characters "
                          "(clients send it as \"model\"), or leave it out for --target")
    spec = resolve_spec(target, draft, method, num_speculative_tokens, speculative_config)
    engine_cfg = EngineConfig(device=device, dtype=dtype, trust_remote_code=trust_remote_code, onednn=onednn,
                              capture=capture)
    _check_limits(port, max_concurrency, max_num_seqs, read_timeout)
    if not host.strip() or any(c.isspace() or not c.isprintable() for c in host):
        raise ConfigError(f"--host {host!r} must name an address, e.g. 127.0.0.1 (loopback) or 0.0.0.0 "
                          "(every interface)")
    _check_can_listen(host, port)  # before the models load: a busy port fails in a second
    if not is_loopback(host):  # after the check: a host that cannot be listened on is one error line
        console.print(f"[yellow]--host {host} is not a loopback address: anyone who can reach it can use "
                      "the server (there is no authentication)[/]")

    tgt, engine = open_engine(target, spec, engine_cfg, log=console.print)
    name = served_model_name or target
    try:
        server = SpecbenchServer(host, port, engine=engine, tokenizer=tgt.tokenizer, spec=spec,
                                 model_name=name, model_root=str(tgt.path), max_context=tgt.max_context,
                                 vocab_size=int(tgt.model.get_input_embeddings().num_embeddings),
                                 max_concurrency=max_concurrency, max_num_seqs=max_num_seqs,
                                 verbose=log_requests, read_timeout_s=read_timeout)
    except OSError as exc:
        raise ConfigError(f"--host {host} --port {port}: cannot listen ({exc.strerror or exc})") from None
    shown = f"[{host}]" if ":" in host else host
    # stdout, one line, flushed: scripts and ServerLauncher wait for it.
    print(f"specbench serve: listening on http://{shown}:{server.port} (model {name}, {spec.short}, "
          f"{tgt.device}, {str(tgt.dtype).replace('torch.', '')})", flush=True)
    _serve_until_stopped(server)


def _check_limits(port: int, max_concurrency: int, max_num_seqs: int | None, read_timeout: float) -> None:
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {port}")
    if max_concurrency < 1:
        raise ConfigError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs must be >= 1, got {max_num_seqs}")
    if not (math.isfinite(read_timeout) and read_timeout > 0):
        raise ConfigError(f"--read-timeout must be a finite number of seconds > 0, got {read_timeout}")


def _serve_until_stopped(server: Any) -> None:
    """Serve until Ctrl-C or SIGTERM, then close the socket and the engine's worker."""
    def stop(signum, frame):  # a signal handler's signature; SIGTERM ends the server like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.worker.close()


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def main() -> None:
    """`python -m specbench.server ARGS` = `specbench serve ARGS`."""
    sys.argv = [sys.argv[0], "serve", *sys.argv[1:]]
    # here, not at module level: specbench.cli imports this module while it registers commands
    from specbench.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
