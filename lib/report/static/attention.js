// The attention view of the report page and of the served model's page: pick an example, a kind of attention,
// a layer and a head (or all heads), then click or hover a token. A row token (a position reading) shows the
// weights of what it reads; a column token (a token read) shows what reads it. The weights are hundredths:
// the report's come from the JSON island #attention-data, the app's from each reply (showAttention(data)).
"use strict";

const showAttention = (function () {
  let data = null;
  const $ = (id) => document.getElementById(id);
  const controls = { example: $("av-example"), kind: $("av-kind"), layer: $("av-layer"), head: $("av-head") };
  let picked = null; // the token clicked, {axis: "row" | "col", index}: it stays
  let hovered = null; // the token under the pointer, shown while it is there

  function option(select, value, label) {
    const item = document.createElement("option");
    item.value = value;
    item.textContent = label;
    select.appendChild(item);
  }

  // New data: the controls offer its examples, kinds, layers and heads, keeping what was chosen where it can.
  function load(next) {
    const kept = Object.fromEntries(Object.entries(controls).map(([name, select]) => [name, select.value]));
    data = next;
    Object.values(controls).forEach((select) => select.replaceChildren());
    data.examples.forEach((example, i) => option(controls.example, i, example.title));
    Object.keys(data.kinds).forEach((kind) => option(controls.kind, kind, kind));
    for (let layer = 0; layer < data.layers; layer++) option(controls.layer, layer, `layer ${layer + 1}`);
    option(controls.head, "all", "all heads");
    for (let head = 0; head < data.heads; head++) option(controls.head, head, `head ${head + 1}`);
    Object.entries(controls).forEach(([name, select]) => {
      if ([...select.options].some((item) => item.value === kept[name])) select.value = kept[name];
    });
    picked = null;
    draw();
  }

  function current() {
    const example = data.examples[Number(controls.example.value)];
    const kind = controls.kind.value;
    const axes = data.kinds[kind];
    const heads = controls.head.value === "all" ? [...Array(data.heads).keys()] : [Number(controls.head.value)];
    return {
      example, heads, rows: example.tokens[axes.rows], cols: example.tokens[axes.cols],
      rowName: axes.rows, colName: axes.cols, weights: example.weights[kind][Number(controls.layer.value)],
    };
  }

  // Hundredths as a cell has room for them: 1, .62, .05, 0.
  function short(weight) {
    return weight >= 100 ? "1" : weight <= 0 ? "0" : "." + String(weight).padStart(2, "0");
  }

  function cell(weight) {
    const td = document.createElement("td");
    td.className = "w" + (weight > 55 ? " light" : "");
    td.style.background = `rgba(31, 119, 180, ${weight / 100})`;
    td.textContent = short(weight);
    td.dataset.weight = weight;
    return td;
  }

  function label(text, axis, index) {
    const th = document.createElement("th");
    th.textContent = text;
    th.dataset.axis = axis;
    th.dataset.index = index;
    th.title = `${axis === "row" ? "reading" : "read"}: ${text} (${index + 1})`;
    th.addEventListener("click", () => { picked = { axis, index }; show(); });
    th.addEventListener("mouseenter", () => { hovered = { axis, index }; show(); });
    th.addEventListener("mouseleave", () => { hovered = null; show(); });
    return th;
  }

  function matrix(view, head) {
    const table = document.createElement("table");
    table.className = "matrix";
    table.dataset.head = head;
    table.createCaption().textContent = `head ${head + 1}`;
    const top = table.createTHead().insertRow();
    top.appendChild(document.createElement("th"));
    view.cols.forEach((token, j) => top.appendChild(label(token, "col", j)));
    const body = table.createTBody();
    view.weights[head].forEach((row, i) => {
      const tr = body.insertRow();
      tr.dataset.row = i;
      tr.appendChild(label(view.rows[i], "row", i));
      row.forEach((weight) => tr.appendChild(cell(weight)));
    });
    return table;
  }

  function draw() {
    const view = current();
    const text = view.example.text;
    $("av-text").textContent = Object.entries(text).map(([name, value]) => `${name}: ${value}`).join("\n");
    const heads = $("av-heads");
    heads.replaceChildren(...view.heads.map((head) => matrix(view, head)));
    $("av-axes").textContent = `rows: the ${view.rowName} position reading · columns: the ${view.colName} token read`;
    if (picked && picked.index >= (picked.axis === "row" ? view.rows : view.cols).length) picked = null;
    hovered = null;
    show();
  }

  // The hovered (else the clicked) row's or column's weights, marked in every head shown, and the largest
  // said in words.
  function show() {
    const view = current();
    document.querySelectorAll("#av-heads .picked").forEach((node) => node.classList.remove("picked"));
    const shown = hovered || picked;
    if (!shown) {
      $("av-readout").textContent = "Click or hover a token: a row token shows what it reads, a column token what reads it.";
      return;
    }
    const { axis, index } = shown;
    const said = [];
    document.querySelectorAll("#av-heads table").forEach((table) => {
      const head = Number(table.dataset.head);
      table.querySelectorAll(`th[data-axis="${axis}"][data-index="${index}"]`).forEach((th) => th.classList.add("picked"));
      let pairs;
      if (axis === "row") {
        table.querySelector(`tr[data-row="${index}"]`).classList.add("picked");
        pairs = view.weights[head][index].map((w, j) => [view.cols[j], w]);
      } else {
        table.querySelectorAll(`tbody tr`).forEach((tr) => tr.cells[index + 1].classList.add("picked"));
        pairs = view.weights[head].map((row, i) => [view.rows[i], row[index]]);
      }
      const top = pairs.filter((pair) => pair[1] > 0).sort((a, b) => b[1] - a[1]).slice(0, 4);
      said.push(`head ${head + 1}: ` + top.map(([token, w]) => `${token} ${(w / 100).toFixed(2)}`).join(", "));
    });
    const token = axis === "row" ? view.rows[index] : view.cols[index];
    const what = axis === "row" ? `${token} (${view.rowName} ${index + 1}) reads` : `${token} (${view.colName} ${index + 1}) is read by`;
    $("av-readout").textContent = `${what}: ` + said.join(" · ");
  }

  Object.values(controls).forEach((select) => select.addEventListener("change", draw));
  const island = document.getElementById("attention-data");
  if (island) load(JSON.parse(island.textContent));
  return load;
})();
