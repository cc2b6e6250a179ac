"""Serve a trained model: a page to type into, and a JSON API.

    python -m lib.use.serve --task cumsum                 # after `make repro`: http://127.0.0.1:8000
    python -m lib.use.serve --task multi30k --models models/multi30k --port 8080

    GET  /               the page: an input box, the output, and the report's attention view (offline, no CDN)
    POST /api/translate  {"text": str | [str], "beam_size", "alpha", "n_best", "attention"}   (translation tasks)
    POST /api/generate   {"prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stream"}  (the LM)
    POST /api/attention  {"text"}: the attention over a text (the LM), for the page after it streams a sample
    GET  /api/info       the task, what the model was trained with, and its metrics
    GET  /healthz        {"status": "ok"}

A bad request gets a JSON 4xx naming the field (``{"error": ..., "field": ...}``), never a traceback. One
request runs the model at a time (a lock): torch already spreads one request over every core, so requests
side by side would only share them, each slower. The server binds 127.0.0.1 unless ``--host`` says otherwise.
"""

import argparse
import json
import logging
import numbers
import threading
import warnings
from pathlib import Path

import torch
from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, NotFound

from lib.use import inference
from lib.report.attention_view import served_view
from lib.report.pages import STATIC, attention_view, page
from lib.tasks import TASKS

log = logging.getLogger(__name__)

# What a request may ask, at most: the input read, the search's width, the tokens drawn, the body's bytes.
MOST_CHARS, MOST_TEXTS, MOST_BEAM, MOST_NEW_TOKENS, MOST_BODY = 2000, 64, 16, 2000, 256 * 1024


class BadRequest(ValueError):
    """A field of the request that cannot be used: a 400 naming it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def integer(body: dict, field: str, default: int, low: int, high: int) -> int:
    value = body.get(field, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BadRequest(field, f"{value!r} is not an integer")
    if not low <= value <= high:
        raise BadRequest(field, f"{value} is not in [{low}, {high}]")
    return int(value)


def number(body: dict, field: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(field, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadRequest(field, f"{value!r} is not a number")
    if not (low < value if low_open else low <= value) or value > high:
        raise BadRequest(field, f"{value} is not in {'(' if low_open else '['}{low}, {high}]")
    return float(value)


def flag(body: dict, field: str) -> bool:
    value = body.get(field, False)
    if not isinstance(value, bool):
        raise BadRequest(field, f"{value!r} is not true or false")
    return value


def text(value, field: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(field, f"{value!r} is not a string")
    if not value.strip():
        raise BadRequest(field, "empty")
    if len(value) > MOST_CHARS:
        raise BadRequest(field, f"{len(value)} characters; at most {MOST_CHARS}")
    return value


def body_of(fields: set[str], required: str) -> dict:
    """The request's JSON object, with only ``fields`` and at least ``required``."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise BadRequest("body", "not a JSON object (send Content-Type: application/json)")
    if unknown := sorted(set(body) - fields):
        raise BadRequest(unknown[0], f"unknown field (known: {', '.join(sorted(fields))})")
    if required not in body:
        raise BadRequest(required, "missing")
    return body


def checked(work):
    """``work()`` with the model's own refusals (an option out of range, a ``ValueError`` naming it) as a
    400, and its warnings (a word read as <unk>, a text past max_len) returned beside the result."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = work()
        except BadRequest:
            raise
        except (ValueError, TypeError) as err:
            raise BadRequest(str(err).split(":")[0].split()[0], str(err)) from None
    return result, [str(w.message) for w in caught]


def create_app(task: str, models: str | Path, metrics: str | Path | None = None) -> Flask:
    """The app over the model in ``models`` (model.pt and tokenizer/), loaded once."""
    model = inference.load(models, task=task)
    lm = isinstance(model, inference.LanguageModel)
    lock = threading.Lock()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MOST_BODY

    @app.errorhandler(BadRequest)
    def bad_request(err: BadRequest):
        return jsonify(error=str(err), field=err.field), 400

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException):  # 404, 405, 413 (a body past MOST_BODY): JSON, as every reply
        return jsonify(error=f"{err.code} {err.name}: {err.description}"), err.code

    @app.errorhandler(Exception)
    def unforeseen(err: Exception):  # a bug: logged here, never a traceback in the reply
        log.exception("unforeseen error serving %s", request.path)
        return jsonify(error="internal error (logged by the server)"), 500

    def only(kind_lm: bool, route: str):
        if lm != kind_lm:
            raise NotFound(f"{route} is for {'a language model' if kind_lm else 'a translation task'}; this "
                           f"server's model ({task}) takes {'/api/generate' if lm else '/api/translate'}")

    @app.get("/healthz")
    def healthz():
        return jsonify(status="ok")

    @app.get("/api/info")
    def info():
        shown = Path(metrics) if metrics else None
        return jsonify(task=task, kind="lm" if lm else "seq2seq", trained_with=json.loads(json.dumps(model.state,
                       default=str)), metrics=json.loads(shown.read_text()) if shown and shown.is_file() else None)

    @app.post("/api/translate")
    def translate():
        only(False, "/api/translate")
        body = body_of({"text", "beam_size", "alpha", "n_best", "attention"}, "text")
        texts = body["text"]
        one = isinstance(texts, str)
        texts = [texts] if one else texts
        if not isinstance(texts, list) or not 1 <= len(texts) <= MOST_TEXTS:
            raise BadRequest("text", f"a string, or a list of 1 to {MOST_TEXTS} strings")
        texts = [text(value, "text") for value in texts]
        beam_size = integer(body, "beam_size", 1, 1, MOST_BEAM)
        n_best = integer(body, "n_best", 1, 1, beam_size)
        alpha = number(body, "alpha", 0.6, 0.0, 10.0)
        shown = flag(body, "attention")
        with lock, torch.inference_mode():
            found, notes = checked(lambda: model.n_best(texts, n_best, beam_size, alpha))
            views, more = checked(lambda: [served_view(model.attention(t, outputs[0].text), t, {
                "source": t, "output": outputs[0].text}) if outputs and shown else None
                for t, outputs in zip(texts, found)])
        results = []
        for t, outputs, view in zip(texts, found, views):
            result = {"text": t, "translation": outputs[0].text if outputs else ""}
            if n_best > 1:
                result["n_best"] = [{"text": o.text, "score": o.score, "log_prob": o.log_prob} for o in outputs]
            if view is not None:
                result["attention"] = view
            results.append(result)
        reply = results[0] if one else {"results": results}
        return jsonify({**reply, "warnings": notes + more})

    @app.post("/api/generate")
    def generate():
        only(True, "/api/generate")
        body = body_of({"prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stream"}, "prompt")
        prompt = text(body["prompt"], "prompt")
        options = dict(max_new_tokens=integer(body, "max_new_tokens", 200, 1, MOST_NEW_TOKENS),
                       temperature=number(body, "temperature", 0.8, 0.0, 100.0, low_open=True),
                       top_k=integer(body, "top_k", 0, 0, 1_000_000), top_p=number(body, "top_p", 1.0, 0.0, 1.0, True),
                       seed=integer(body, "seed", 0, 0, 2 ** 63 - 1))
        if not flag(body, "stream"):
            with lock, torch.inference_mode():
                continuation, notes = checked(lambda: "".join(model.stream(prompt, **options)))
            return jsonify(prompt=prompt, continuation=continuation, text=prompt + continuation, warnings=notes)
        with lock:  # the first piece's errors are a 400, before the stream starts
            pieces, notes = checked(lambda: model.stream(prompt, **options))

        def events():  # server-sent events: a piece each, then "end"
            with lock, torch.inference_mode():
                for note in notes:
                    yield f"event: warning\ndata: {json.dumps(note)}\n\n"
                for piece in pieces:
                    yield f"data: {json.dumps(piece)}\n\n"
            yield "event: end\ndata: {}\n\n"
        return Response(events(), mimetype="text/event-stream")

    @app.post("/api/attention")
    def attention():
        body = body_of({"text"}, "text")
        given = text(body["text"], "text")
        with lock, torch.inference_mode():
            found, notes = checked(lambda: model.attention(given))
        return jsonify(attention=served_view(found, given[:60], {"text": given}), warnings=notes)

    the_page = app_page(task, lm)  # made once: it changes with the model alone

    @app.get("/")
    def index():
        return Response(the_page, mimetype="text/html")

    return app


def app_page(task: str, lm: bool) -> str:
    """The served model's page: its form, the output, and the report's attention view."""
    what, box = ("Continue a text", "ROMEO:") if lm else ("Translate", "")
    form = (f'<form id="ask"><label for="input">{what}</label><br><textarea id="input" rows="3" cols="80" '
            f'placeholder="{"a prompt" if lm else "a sentence"}">{box}</textarea><br>'
            + ('<label>tokens <input id="max_new_tokens" type="number" value="200" min="1" max="2000"></label> '
               '<label>temperature <input id="temperature" type="number" value="0.8" step="0.1" min="0.1"></label> '
               if lm else '<label>beam size <input id="beam_size" type="number" value="1" min="1" max="16"></label> ')
            + '<button type="submit" id="submit">Run</button></form>')
    body = (f'<main data-kind="{"lm" if lm else "seq2seq"}"><h1>{task}</h1>\n{form}\n'
            '<h2>Output</h2><pre id="output"></pre><p class="legend" id="notes"></p>\n'
            + attention_view("The attention that wrote the output, every kind, layer and head.") + "</main>")
    return page(f"{task}: the model", body, (STATIC / "attention.js").read_text() + (STATIC / "app.js").read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lib.use.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--models", help="model.pt and tokenizer/ (default: models/<task>)")
    parser.add_argument("--metrics", help="its metrics.json, for /api/info (default: reports/<task>/metrics.json)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default: 127.0.0.1, this machine)")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(args.task, args.models or f"models/{args.task}",
                         args.metrics or f"reports/{args.task}/metrics.json")
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"serve: error: {err}\n")
    app.run(host=args.host, port=args.port, threaded=True)


if __name__ == "__main__":
    main()
