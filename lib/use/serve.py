"""Serve a trained model: a page to type into, and a JSON API.

    python -m lib.use.serve --task cumsum                 # after `make repro`: http://127.0.0.1:8000
    python -m lib.use.serve --task multi30k --models models/multi30k --port 8080

    GET  /               the page: an input box, the output, and the report's attention view (offline, no CDN)
    POST /api/translate  {"text": str | [str], "beam_size", "alpha", "n_best", "attention"}   (translation tasks)
    POST /api/generate   {"prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stream"}  (the LM)
    POST /api/attention  {"text"}: the attention over a text (the LM), for the page after it streams a sample
    GET  /api/info       the task, what the model was trained with, and its metrics
    GET  /healthz        {"status": "ok"}

Every error is JSON of one shape, ``{"error": ..., "field": ...}``: a bad request's 400 names the field, and a 404,
405, 413 or 500 has field null; never a traceback. Warnings name the request's own fields. It serves through
waitress, a production WSGI server in pure Python (``--debug``: Flask's development server, which reloads on
each code change). One request runs the model at a time (a lock): torch already spreads one request over
every core, so requests side by side would only share them, each slower. The server binds 127.0.0.1 unless
``--host`` says otherwise.
"""

import argparse
import html
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from flask import Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, NotFound

from lib.core.options import OPTIONS
from lib.use import inference
from lib.use.families import USES, UseFamily
from lib.use.request_fields import BadRequest, body_of, checked, flag, option, text
from lib.report.attention_view import served_view
from lib.report.pages import STATIC, attention_view, page
from lib.tasks import task_names

log = logging.getLogger(__name__)

# What a request may ask, at most: the input read and the body's bytes (the options' bounds are the schema's).
MOST_TEXTS, MOST_BODY = 64, 256 * 1024
MOST_BEAM = OPTIONS["beam_size"].served_high


@dataclass
class Served:
    """What the app holds: the task's model, loaded once, and the lock that lets one request run it at a time."""

    task: str
    family: UseFamily  # the model's (lib.use.families): its route, options and page
    model: inference.Translator | inference.LanguageModel
    metrics: Path | None
    defaults: dict  # the model's, each within the server's bounds (lib.core.options.served_defaults)
    notes: list[str]  # a default brought down to a bound, said in /api/info and logged at start
    lock: threading.Lock = field(default_factory=threading.Lock)


def served() -> Served:
    return current_app.extensions["served"]


def served_defaults(defaults: dict) -> tuple[dict, list[str]]:
    """``defaults`` (a model's, from its evaluate stage) within the web app's bounds, and a note for each one
    brought down to its bound: a model evaluated with beam_size 32 is served at 16, not refused every request."""
    kept, notes = dict(defaults), []
    for name, value in defaults.items():
        high = OPTIONS[name].served_high if name in OPTIONS else None
        if high is not None and OPTIONS[name].of_type(value) and value > high:
            kept[name] = type(value)(high)
            notes.append(f"{name}: the model's default {value} (its evaluate stage's) is past the server's bound "
                         f"{high:g}; a request that leaves {name} out gets {high:g}")
    return kept, notes


def only(route: str):
    """A 404 for a route of another model family than the served model's."""
    if (family := served().family).route != route:
        meant = next(other for other in USES.values() if other.route == route)
        raise NotFound(f"{route} is for {meant.title}; this server's model ({served().task}) takes {family.route}")


def bad_request(err: BadRequest):
    return jsonify(error=str(err), field=err.field), 400


def http_error(err: HTTPException):  # 404, 405, 413 (a body past MOST_BODY): the 400's shape, no field at fault
    return jsonify(error=f"{err.code} {err.name}: {err.description}", field=None), err.code


def unforeseen(err: Exception):  # a bug: logged here, never a traceback in the reply
    log.exception("unforeseen error serving %s", request.path)
    return jsonify(error="internal error (logged by the server)", field=None), 500


def healthz():
    return jsonify(status="ok")


def info():
    state, shown = served(), served().metrics
    return jsonify(task=state.task, kind=state.family.name,
                   trained_with=json.loads(json.dumps(state.model.state, default=str)),
                   decodes_with={name: state.defaults[name] for name in state.family.served},
                   notes=state.notes,
                   metrics=json.loads(shown.read_text()) if shown and shown.is_file() else None)


def translate():
    only("/api/translate")
    body = body_of({"text", "attention", *served().family.served}, "text")
    texts = body["text"]
    one = isinstance(texts, str)
    texts = [texts] if one else texts
    if not isinstance(texts, list) or not 1 <= len(texts) <= MOST_TEXTS:
        raise BadRequest("text", f"a string, or a list of 1 to {MOST_TEXTS} strings")
    texts = [text(value, "text") for value in texts]
    defaults = served().defaults
    beam_size, alpha = option(body, "beam_size", defaults["beam_size"]), option(body, "alpha", defaults["alpha"])
    n_best = option(body, "n_best", 1)
    if n_best > beam_size:
        raise BadRequest("n_best", f"n_best {n_best}: must be in [1, beam_size {beam_size}]")
    shown, model = flag(body, "attention"), served().model
    with served().lock, torch.inference_mode():
        found, notes = checked(lambda: model.n_best(texts, n_best, beam_size, alpha), "text", one)
        views, more = checked(lambda: [served_view(model.attention(t, outputs[0].text), t, {
            "source": t, "output": outputs[0].text}) if outputs and shown else None
            for t, outputs in zip(texts, found)], "text", one)
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


def generate():
    only("/api/generate")
    body = body_of({"prompt", "stream", *served().family.served}, "prompt")
    prompt = text(body["prompt"], "prompt")
    options = {name: option(body, name, served().defaults[name]) for name in served().family.served}
    state = served()
    if not flag(body, "stream"):
        with state.lock, torch.inference_mode():
            continuation, notes = checked(lambda: "".join(state.model.stream(prompt, **options)), "prompt")
        return jsonify(prompt=prompt, continuation=continuation, text=prompt + continuation, warnings=notes)
    with state.lock:  # the first piece's errors are a 400, before the stream starts
        pieces, notes = checked(lambda: state.model.stream(prompt, **options), "prompt")

    def events():  # server-sent events: a piece each, then "end"
        with state.lock, torch.inference_mode():
            for note in notes:
                yield f"event: warning\ndata: {json.dumps(note)}\n\n"
            for piece in pieces:
                yield f"data: {json.dumps(piece)}\n\n"
        yield "event: end\ndata: {}\n\n"
    return Response(events(), mimetype="text/event-stream")


def attention():
    body = body_of({"text"}, "text")
    given = text(body["text"], "text")
    with served().lock, torch.inference_mode():
        found, notes = checked(lambda: served().model.attention(given), "text")
    return jsonify(attention=served_view(found, given[:60], {"text": given}), warnings=notes)


def index():
    return Response(current_app.extensions["page"], mimetype="text/html")


def create_app(task: str, models: str | Path, metrics: str | Path | None = None) -> Flask:
    """The app over the model in ``models`` (model.pt and tokenizer/), loaded once."""
    model = inference.load(models, task=task)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MOST_BODY
    defaults, notes = served_defaults(model.defaults)
    for note in notes:
        log.warning("%s", note)
    family = USES[model.state["kind"]]
    app.extensions["served"] = Served(task, family, model, Path(metrics) if metrics else None, defaults, notes)
    app.extensions["page"] = app_page(task, family, defaults)
    app.register_error_handler(BadRequest, bad_request)
    app.register_error_handler(HTTPException, http_error)
    app.register_error_handler(Exception, unforeseen)
    for rule, handler, methods in (("/healthz", healthz, ["GET"]), ("/api/info", info, ["GET"]),
                                   ("/api/translate", translate, ["POST"]), ("/api/generate", generate, ["POST"]),
                                   ("/api/attention", attention, ["POST"]), ("/", index, ["GET"])):
        app.add_url_rule(rule, view_func=handler, methods=methods)
    return app


def app_page(task: str, family: UseFamily, defaults: dict) -> str:
    """The served model's page: its family's form (the model's default options filled in), the output, and the
    report's attention view."""
    most = {name: f"{option.served_high:g}" for name, option in OPTIONS.items() if option.served_high}
    body = (f'<main data-kind="{family.name}"><h1>{html.escape(task)}</h1>\n{family.form(defaults, most)}\n'
            '<h2>Output</h2><pre id="output"></pre><p class="legend" id="notes"></p>\n'
            + attention_view("The attention that wrote the output, every kind, layer and head.") + "</main>")
    return page(f"{task}: the model", body, (STATIC / "attention.js").read_text() + (STATIC / "app.js").read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lib.use.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, choices=task_names())
    parser.add_argument("--models", help="model.pt and tokenizer/ (default: models/<task>)")
    parser.add_argument("--metrics", help="its metrics.json, for /api/info (default: reports/<task>/metrics.json)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default: 127.0.0.1, this machine)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=4, help="waitress's worker threads: requests read and "
                        "answered side by side (the model runs one at a time)")
    parser.add_argument("--debug", action="store_true", help="Flask's development server, reloading on each code "
                        "change, instead of waitress")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(args.task, args.models or f"models/{args.task}",
                         args.metrics or f"reports/{args.task}/metrics.json")
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"serve: error: {err}\n")
    if args.debug:
        app.run(host=args.host, port=args.port, threaded=True, debug=True)
        return
    import waitress  # imported here: only the served process needs it

    waitress.serve(app, host=args.host, port=args.port, threads=args.threads, ident="lib.use.serve")


if __name__ == "__main__":
    main()
