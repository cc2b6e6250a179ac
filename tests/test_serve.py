"""lib.use.serve: the JSON API through Flask's test client, the page in a real browser, and a bounded load against
127.0.0.1."""

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from werkzeug.serving import make_server

from tools.serve_load import hammer
from lib.use import generate, inference
from lib.use.request_fields import MOST_CHARS
from lib.use.serve import MOST_BEAM, MOST_BODY, create_app
from tests.test_lm import lm_built, models_dir  # noqa: F401 (fixtures: the tiny LM)
from tests.test_report_page import Visit, browser  # noqa: F401 (the headless Chromium, a fixture)
from tests.test_stages import built  # noqa: F401 (the tiny cumsum pipeline, a fixture)


@pytest.fixture(scope="module")
def models(built, tmp_path_factory):
    """The tiny cumsum model laid out as `dvc repro` leaves it: model.pt and tokenizer/."""
    directory = tmp_path_factory.mktemp("served") / "cumsum"
    shutil.copytree(built["tokenizer"], directory / "tokenizer")
    shutil.copyfile(built["model"], directory / "model.pt")
    return directory


@pytest.fixture(scope="module")
def client(models, built):
    return create_app("cumsum", models, built["metrics"]).test_client()


def test_health_and_info(client, built):
    assert client.get("/healthz").json == {"status": "ok"}
    info = client.get("/api/info").json
    assert info["task"] == "cumsum" and info["kind"] == "seq2seq"
    assert info["metrics"] == json.loads(built["metrics"].read_text())
    assert info["trained_with"]["model_config"]["d_model"] == 16 and "step" in info["trained_with"]


def test_a_model_evaluated_past_a_served_bound_is_served_at_the_bound(models, built, tmp_path, tiny_params):
    """evaluate.beam_size 32 is a valid param (the schema's range), and the model's generation.json then says 32,
    past the server's 16: a request that leaves beam_size out gets 16 and a note, never a 400 every time."""
    from lib.evaluate.options import write_defaults
    from lib.tasks.params import stage_config

    tiny_params["cumsum"]["evaluate"]["beam_size"] = 32
    directory = tmp_path / "cumsum"
    shutil.copytree(models, directory)
    write_defaults(directory / "generation.json", stage_config(tiny_params, "cumsum", "evaluate"))
    client = create_app("cumsum", directory, built["metrics"]).test_client()
    reply = client.post("/api/translate", json={"text": "1 2 3"})
    assert reply.status_code == 200, reply.json
    expected = inference.load(directory).translate(["1 2 3"], beam_size=MOST_BEAM)[0]
    assert reply.json["translation"] == expected
    info = client.get("/api/info").json
    assert info["decodes_with"]["beam_size"] == MOST_BEAM
    assert info["notes"] == [f"beam_size: the model's default 32 (its evaluate stage's) is past the server's bound "
                             f"{MOST_BEAM}; a request that leaves beam_size out gets {MOST_BEAM}"]


def test_an_out_of_range_option_is_said_alike_by_params_and_by_the_schema(models, tiny_params):
    from lib.core.config import ConfigError
    from lib.tasks.params import stage_config

    tiny_params["cumsum"]["evaluate"]["beam_size"] = 2000
    with pytest.raises(ConfigError) as by_params:
        stage_config(tiny_params, "cumsum", "evaluate")
    with pytest.raises(ValueError) as by_schema:
        inference.load(models).translate(["1 2"], beam_size=2000)
    said = "2000: must be in [1, 1000] (1: greedy)"
    assert str(by_params.value) == f"cumsum.evaluate.beam_size: {said}" and str(by_schema.value) == f"beam_size {said}"


def test_a_translation_equals_lib_generates_alone_and_as_a_batch(client, models, tmp_path):
    sources = ["1 2 3 4", "9 8 7", "5 5 5 5 5 5"]
    (tmp_path / "in.txt").write_text("\n".join(sources) + "\n")
    for beam in (1, 3):
        generate.main(["--task", "cumsum", "--models", str(models), "--beam-size", str(beam),
                       "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")])
        expected = (tmp_path / "out.txt").read_text().splitlines()
        batch = client.post("/api/translate", json={"text": sources, "beam_size": beam}).json
        assert [r["translation"] for r in batch["results"]] == expected
        alone = client.post("/api/translate", json={"text": sources[0], "beam_size": beam}).json
        assert alone["translation"] == expected[0] and alone["warnings"] == []


def test_n_best_and_the_attention_are_the_models(client, models):
    reply = client.post("/api/translate", json={"text": "3 1 4", "beam_size": 3, "n_best": 2,
                                                "attention": True}).json
    translator = inference.load(models)
    best = translator.n_best("3 1 4", 2, 3)
    assert [o["text"] for o in reply["n_best"]] == [o.text for o in best]
    assert reply["n_best"][0]["score"] == pytest.approx(best[0].score)
    view = reply["attention"]
    assert set(view["kinds"]) == {"encoder self", "decoder self", "cross"}
    cross = translator.attention("3 1 4", best[0].text)["cross-attention"]
    assert view["examples"][0]["weights"]["cross"][0] == (cross.layers[0] * 100).round().int().tolist()
    assert view["examples"][0]["tokens"]["source"] == cross.cols


@pytest.mark.parametrize("body, status, field", [
    ({"text": 5}, 400, "text"),
    ({"text": []}, 400, "text"),
    ({"text": ["1 2"] * 65}, 400, "text"),
    ({"text": ""}, 400, "text"),
    ({"text": "1" * (MOST_CHARS + 1)}, 400, "text"),
    ({"text": "1 2", "beam_size": 0}, 400, "beam_size"),
    ({"text": "1 2", "beam_size": MOST_BEAM + 1}, 400, "beam_size"),
    ({"text": "1 2", "beam_size": 2.5}, 400, "beam_size"),
    ({"text": "1 2", "beam_size": True}, 400, "beam_size"),
    ({"text": "1 2", "beam_size": 2, "n_best": 3}, 400, "n_best"),
    ({"text": "1 2", "alpha": -1}, 400, "alpha"),
    ({"text": "1 2", "alpha": "high"}, 400, "alpha"),
    ({"text": "1 2", "attention": "yes"}, 400, "attention"),
    ({"text": "1 2", "colour": "red"}, 400, "colour"),
    ({"beam_size": 2}, 400, "text"),
    ([1, 2], 400, "body"),
])
def test_a_bad_request_is_a_json_4xx_naming_the_field_and_the_server_keeps_serving(client, body, status, field):
    reply = client.post("/api/translate", json=body)
    assert reply.status_code == status and reply.json["field"] == field and reply.json["error"].startswith(field)
    assert client.post("/api/translate", json={"text": "1 2"}).status_code == 200


def test_what_is_not_a_request_to_this_model_is_a_json_4xx(client):
    """400, 404, 405 and 413 in one JSON shape, {"error", "field"}: the field null where none is at fault."""
    assert client.post("/api/translate", data="not json").json["field"] == "body"
    replies = {400: client.post("/api/translate", data="{", content_type="application/json"),
               413: client.post("/api/translate", data="x" * (MOST_BODY + 1), content_type="application/json"),
               405: client.get("/api/translate"), 404: client.get("/nowhere")}
    for status, reply in replies.items():
        assert reply.status_code == status and set(reply.json) == {"error", "field"}, status
        assert reply.json["field"] == ("body" if status == 400 else None)
        assert "Traceback" not in reply.get_data(as_text=True)
    wrong = client.post("/api/generate", json={"prompt": "1 2"})
    assert wrong.status_code == 404 and "this server's model (cumsum) takes /api/translate" in wrong.json["error"]


def test_warnings_name_the_requests_own_fields(client):
    """A word the tokenizer never saw: the warning names the request's text (its index in a list), not the
    Python API's argument or method."""
    alone = client.post("/api/translate", json={"text": "3 x 4"}).json["warnings"]
    listed = client.post("/api/translate", json={"text": ["1 2", "3 x 4"], "beam_size": 2}).json["warnings"]
    assert alone and all(note.startswith("text: ") for note in alone), alone
    assert listed and all(note.startswith("text[1]: ") for note in listed), listed
    assert not any("sentences" in note or "n_best" in note for note in alone + listed)


@pytest.mark.slow
def test_the_serve_command_runs_a_production_server(models, built):
    """python -m lib.use.serve: waitress, not Flask's development server and its warning."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "lib.use.serve", "--task", "cumsum", "--models", str(models),
                               "--metrics", str(built["metrics"]), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
                    assert json.load(reply) == {"status": "ok"}
                    break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("the server did not answer /healthz within 60 s")
    finally:
        server.terminate()
        said = server.communicate(timeout=30)[0]
    assert "development server" not in said and "Serving on http://127.0.0.1:" in said, said


def test_a_model_of_another_task_is_refused_at_start(models):
    with pytest.raises(ValueError, match="was trained for the cumsum task, not multi30k"):
        create_app("multi30k", models)


@pytest.fixture(scope="module")
def lm_client(lm_built, tmp_path_factory):
    return create_app("shakespeare", models_dir(lm_built, tmp_path_factory.mktemp("lm_served"))).test_client()


def test_the_lm_streams_what_it_samples_and_replies_in_json_too(lm_client, lm_built, tmp_path):
    options = {"prompt": "ROMEO:", "max_new_tokens": 40, "temperature": 0.8, "top_k": 5, "seed": 3}
    lm = inference.load(models_dir(lm_built, tmp_path))
    expected = lm.sample("ROMEO:", 40, 0.8, 5, seed=3)
    reply = lm_client.post("/api/generate", json=options).json
    assert reply["text"] == expected and reply["continuation"] == expected[len("ROMEO:"):]
    streamed = lm_client.post("/api/generate", json={**options, "stream": True})
    assert streamed.mimetype == "text/event-stream"
    events = streamed.get_data(as_text=True).split("\n\n")
    pieces = [json.loads(event[6:]) for event in events if event.startswith("data: ")]
    assert len(pieces) > 1 and "ROMEO:" + "".join(pieces) == expected and "event: end" in events[-2]
    shown = lm_client.post("/api/attention", json={"text": expected}).json["attention"]
    assert list(shown["kinds"]) == ["self"] and shown["examples"][0]["tokens"]["text"][:6] == list("ROMEO:")


@pytest.mark.parametrize("body, field", [
    ({"prompt": "R", "temperature": 0}, "temperature"),
    ({"prompt": "R", "max_new_tokens": 100_000}, "max_new_tokens"),
    ({"prompt": "R", "top_p": 0}, "top_p"),
    ({"prompt": "R", "seed": 2 ** 64}, "seed"),  # the schema's range, as generate's --seed
    ({"prompt": "  "}, "prompt"),
    ({"prompt": "R", "stream": 1}, "stream"),
])
def test_a_bad_lm_request_is_a_400_naming_the_field(lm_client, body, field):
    reply = lm_client.post("/api/generate", json=body)
    assert reply.status_code == 400 and reply.json["field"] == field
    assert lm_client.post("/api/translate", json={"text": "R"}).status_code == 404


@pytest.fixture(scope="module")
def live(models, built):
    """The app served for real on 127.0.0.1, a free port, in a thread."""
    server = make_server("127.0.0.1", 0, create_app("cumsum", models, built["metrics"]), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.slow
def test_the_page_translates_what_is_typed_and_shows_its_attention(browser, live, models):
    visit = Visit(browser, live + "/")
    page = visit.page
    page.fill("#input", "2 7 1")
    page.click("#submit")
    page.wait_for_selector("#av-heads table")
    assert page.text_content("#output") == inference.load(models).translate("2 7 1")
    assert page.locator("#av-example option").first.text_content() == "2 7 1"
    page.locator("#av-heads table").first.locator('tbody th[data-index="1"]').click()
    assert page.locator("#av-heads tr.picked").count() >= 1
    typed = '<img src=x onerror="window.pwned = 1"> 3 <b>4</b>'  # markup typed in: shown as text, never run
    page.fill("#input", typed)
    page.click("#submit")
    page.wait_for_function(f"document.querySelector('#av-example option').textContent === {typed!r}")
    assert page.evaluate("typeof window.pwned") == "undefined" and page.locator("img[src='x'], b").count() == 0
    page.fill("#input", "")
    page.click("#submit")
    page.wait_for_function("document.getElementById('notes').textContent.length > 0")
    assert page.text_content("#notes") == "text: empty"
    assert visit.errors == ["Failed to load resource: the server responded with a status of 400 (BAD REQUEST)"]
    assert all(url.startswith(live) for url in visit.requests), visit.requests
    page.close()


@pytest.mark.slow
def test_eight_clients_two_hundred_requests_no_error(live):
    """The load benchmark's own loop, bounded: it stops by itself; its figures go to docs/results.md, not here."""
    for body in ({"text": "1 2 3 4 5"}, {"text": "1 2 3 4 5", "beam_size": 5}):
        stats = hammer(live + "/api/translate", body, clients=8, requests=200)
        assert stats["errors"] == 0 and stats["requests"] == 200
