"""`ptxf` follows a redirect but never sends its token to another origin."""

import http.server
import json
import threading

import pytest

from portal import cli


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list = []
    target = ""

    def do_GET(self):  # noqa: N802
        Recorder.seen.append(
            (self.server.server_port, self.path, self.headers.get("Authorization"))
        )
        if self.path.startswith("/api/v1/jobs/") and Recorder.target:
            self.send_response(302)
            self.send_header("Location", Recorder.target + "/landing")
            self.end_headers()
            return
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    made = [http.server.HTTPServer(("127.0.0.1", 0), Recorder) for _ in range(2)]
    for s in made:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    Recorder.seen = []
    yield made
    for s in made:
        s.shutdown()


def test_the_token_is_not_sent_to_another_origin_on_a_redirect(servers):
    home, other = servers
    Recorder.target = f"http://127.0.0.1:{other.server_port}"
    client = cli.Client(f"http://127.0.0.1:{home.server_port}", "ptxf_abc_secret")
    assert client.json("GET", "jobs/x/") == {"ok": True}
    (p1, _, auth1), (p2, path2, auth2) = Recorder.seen
    assert (p1, auth1) == (home.server_port, "Bearer ptxf_abc_secret")
    assert (p2, path2, auth2) == (other.server_port, "/landing", None)


def test_the_token_is_kept_on_a_redirect_within_the_portal(servers):
    home, _ = servers
    Recorder.target = f"http://127.0.0.1:{home.server_port}"
    client = cli.Client(f"http://127.0.0.1:{home.server_port}", "ptxf_abc_secret")
    client.json("GET", "jobs/x/")
    assert [auth for _, _, auth in Recorder.seen] == ["Bearer ptxf_abc_secret"] * 2
