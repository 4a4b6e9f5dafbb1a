"""The server launcher (`specbench.backends.launcher`): command templates split before their
placeholders are filled (no shell, JSON braces kept), a server that exits before it is ready
reported with its exit code, and `stop()` returning only once the server's whole process
group is gone. Stand-in servers only; `specbench serve` launched this way is in tests/serve."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from specbench.backends.launcher import ServerLauncher, render
from specbench.errors import BackendError, ConfigError


def test_template_is_split_before_substitution_and_keeps_json_braces():
    argv = render("serve {target} --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": {k}}'",
                  {"target": "my model; rm -rf /", "k": 4})
    assert argv == ["serve", "my model; rm -rf /", "--speculative-config",
                    '{"method": "ngram", "num_speculative_tokens": 4}']
    with pytest.raises(ConfigError, match=r"no value for \{draft\}"):
        render("serve {draft}", {"target": "x"})


def test_launcher_reports_a_server_that_exits_early(tmp_path):
    log = tmp_path / "server.log"
    launcher = ServerLauncher("{python} -c 'import sys; print(\"boom\"); sys.exit(3)' {port}",
                              {"python": sys.executable}, ready_timeout_s=60, log_path=log)
    with pytest.raises(BackendError, match="exited with code 3") as info:
        launcher.start()
    assert f"log {log}: 'boom'" in str(info.value)  # where its output went, and how it ended
    with pytest.raises(ConfigError, match="no-such-server-binary"):
        ServerLauncher("no-such-server-binary --port {port}", log_path=tmp_path / "none.log").start()


GROUP_SERVER = """
import http.server, subprocess, sys
# a worker that ignores SIGTERM and outlives its parent, as a slow-to-exit engine process would
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[2], "w").write(str(child.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_stop_returns_once_the_whole_process_group_is_gone(tmp_path):
    script, pidfile = tmp_path / "srv.py", tmp_path / "child.pid"
    script.write_text(GROUP_SERVER)
    launcher = ServerLauncher("{python} {script} {port} {pidfile}",
                              {"python": sys.executable, "script": script, "pidfile": pidfile}, ready_timeout_s=60,
                              log_path=tmp_path / "server.log")
    launcher.start()
    child = int(pidfile.read_text())
    try:
        assert _alive(child)
        launcher.stop(timeout_s=1.0)  # the parent dies of SIGTERM at once; the worker needs SIGKILL
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, 9)
