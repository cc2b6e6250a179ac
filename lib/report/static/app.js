// The served model's page: send the input to the API, show the output (an LM's as it streams) and the
// attention that wrote it, in the report's view (showAttention, from attention.js).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const lm = document.querySelector("main").dataset.kind === "lm";

  async function post(path, body) {
    const reply = await fetch(path, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    if (!reply.ok) {
      const said = await reply.json().catch(() => ({ error: reply.statusText }));
      throw new Error(said.error);
    }
    return reply;
  }

  async function translate(text) {
    const reply = await (await post("/api/translate", {
      text, beam_size: Number($("beam_size").value), attention: true,
    })).json();
    $("output").textContent = reply.translation;
    $("notes").textContent = reply.warnings.join(" ");
    if (reply.attention) showAttention(reply.attention);
  }

  // Server-sent events over fetch: each "data:" line is a piece of the continuation, as drawn.
  async function generate(prompt) {
    const reply = await post("/api/generate", {
      prompt, stream: true, max_new_tokens: Number($("max_new_tokens").value),
      temperature: Number($("temperature").value),
    });
    const reader = reply.body.pipeThrough(new TextDecoderStream()).getReader();
    let text = prompt, pending = "";
    $("output").textContent = text;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += value;
      const events = pending.split("\n\n");
      pending = events.pop();
      for (const event of events) {
        const data = event.split("\n").find((line) => line.startsWith("data: "));
        if (!event.startsWith("event:") && data) {
          text += JSON.parse(data.slice(6));
          $("output").textContent = text;
        }
      }
    }
    const shown = await (await post("/api/attention", { text })).json();
    showAttention(shown.attention);
  }

  $("ask").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("submit").disabled = true;
    $("notes").textContent = "";
    try {
      await (lm ? generate : translate)($("input").value);
    } catch (error) {
      $("notes").textContent = error.message;
    } finally {
      $("submit").disabled = false;
    }
  });
})();
