"""A real retrieval server for tests: the HTTP API SkyRL's `search` environment calls, over a small corpus.

`POST /retrieve` with `{"query", "topk", "return_scores"}` answers `{"result": [[{"document": {"contents"},
"score"}, ...]]}`, documents ranked by how many of the query's words they contain (ties in corpus order). It
listens on 127.0.0.1 on a free port and counts the requests it served.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CORPUS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "The Nile is the longest river in Africa.",
    "Mount Everest is the highest mountain above sea level.",
    "Canberra is the capital city of Australia.",
]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


class RetrievalServer:
    def __init__(self, corpus: list[str] = CORPUS):
        self.corpus = corpus
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the http.server name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                server.requests += 1
                if self.path != "/retrieve" or not isinstance(body.get("query"), str):
                    self.send_error(400)
                    return
                ranked = server.search(body["query"], int(body.get("topk") or 3))
                docs = [{"document": {"contents": text}, "score": float(score)} for text, score in ranked]
                if not body.get("return_scores"):
                    docs = [d["document"] for d in docs]
                payload = json.dumps({"result": [docs]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def search(self, query: str, topk: int) -> list[tuple[str, int]]:
        words = _words(query)
        scored = [(text, len(words & _words(text))) for text in self.corpus]
        return sorted(scored, key=lambda x: -x[1])[:topk]

    def __enter__(self) -> RetrievalServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
