// The frontend of liveplot.py: PlotlyLib (kind "lib") evaluates plotly.min.js once per page;
// LivePlot (kind "plot") keeps the plot's content per model (not per view) and draws it.
// The message protocol is appendplot.py's; applyMsg mirrors appendplot.apply.

const G = globalThis;

function plotlyHolder() {
  if (!G.__wbPlotly) {
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    G.__wbPlotly = { promise, resolve, loaded: false };
  }
  return G.__wbPlotly;
}

function loadPlotly(source) {
  const h = plotlyHolder();
  if (h.loaded || !source) return h.promise;
  h.loaded = true;
  // plotly.min.js is a UMD bundle: given a CommonJS `module` it puts Plotly there and touches no global.
  const module = { exports: {} };
  new Function("module", "exports", "define", source)(module, module.exports, undefined);
  h.resolve(module.exports);
  return h.promise;
}

function copyPoints(pts) {
  const out = {};
  for (const k of Object.keys(pts || {})) out[k] = Array.from(pts[k]);
  return out;
}

function applyMsg(s, msg) {
  if (msg.full) {
    s.traces = {};
    s.tails = {};
    s.xtitle = msg.xtitle || null;
    s.layout = msg.layout || {};
  } else if ("layout" in msg) {
    s.layout = msg.layout || {};
  }
  const reset = new Set(msg.reset || []);
  for (const [name, pts] of Object.entries(msg.traces || {})) {
    const have = s.traces[name];
    if (!have || reset.has(name)) {
      s.traces[name] = copyPoints(pts);
    } else {
      for (const [k, v] of Object.entries(pts)) have[k] = (have[k] || []).concat(v);
    }
  }
  for (const [name, pts] of Object.entries(msg.tails || {})) s.tails[name] = copyPoints(pts);
  s.seq = msg.seq;
}

const STORES = new WeakMap();

function storeFor(model) {
  let s = STORES.get(model);
  if (s) return s;
  s = { seq: 0, xtitle: null, layout: {}, traces: {}, tails: {}, views: new Set(), askedAt: -Infinity, updates: 0 };
  const data = model.get("data") || {};
  applyMsg(s, { ...data, full: true, reset: Object.keys(data.traces || {}), seq: data.seq || 0 });
  model.on("msg:custom", (msg) => {
    if (!msg || msg.type !== "update") return;
    if (!msg.full && msg.prev !== s.seq) {
      if (msg.seq <= s.seq) return; // already in the state this model was built from
      // A message was missed (sent while this model's module loaded): ask for the whole content. The
      // kernel answers when its shell is free; it also sends one unasked after each state request.
      const now = performance.now();
      if (now - s.askedAt > 2000) {
        s.askedAt = now;
        model.send({ type: "sync" });
      }
      return;
    }
    applyMsg(s, msg);
    s.updates += 1;
    for (const draw of s.views) draw();
  });
  STORES.set(model, s);
  model.send({ type: "ready", seq: s.seq });
  return s;
}

function figureData(s, spec) {
  const styles = spec.traces || [];
  const known = new Set(styles.map((t) => t.name));
  const extra = Object.keys(s.traces).filter((n) => !known.has(n)).map((name) => ({ name, mode: "lines" }));
  return styles.concat(extra).map((style) => {
    const main = s.traces[style.name] || {};
    const tail = s.tails[style.name] || {};
    const t = { ...style };
    for (const k of ["x", "y", "customdata", "text"]) {
      if (main[k] || tail[k]) t[k] = (main[k] || []).concat(tail[k] || []);
    }
    if (!t.x) { t.x = []; t.y = []; }
    return t;
  });
}

function merged(base, patch) {
  const out = { ...base };
  for (const [k, v] of Object.entries(patch || {})) {
    const plain = (x) => x && typeof x === "object" && !Array.isArray(x);
    out[k] = plain(v) && plain(base[k]) ? merged(base[k], v) : v;
  }
  return out;
}

function layoutFor(s, spec) {
  const layout = merged(spec.layout || {}, s.layout || {});
  layout.datarevision = s.seq;
  if (s.xtitle) layout.xaxis = merged(layout.xaxis || {}, { title: { text: s.xtitle } });
  return layout;
}

function laidOut(div) {
  return new Promise((resolve) => {
    if (div.isConnected && div.clientWidth > 0) return resolve();
    const seen = new ResizeObserver(() => {
      if (div.isConnected && div.clientWidth > 0) {
        seen.disconnect();
        resolve();
      }
    });
    seen.observe(div);
  });
}

async function renderPlot(model, el) {
  const spec = model.get("spec") || {};
  const s = storeFor(model);
  const div = document.createElement("div");
  div.className = "wb-liveplot";
  div.style.width = "100%";
  div.style.minHeight = `${(spec.layout && spec.layout.height) || 380}px`;
  const note = document.createElement("div");
  note.className = "wb-liveplot-loading";
  note.textContent = "loading plotly.js …";
  el.append(note, div);
  const Plotly = await plotlyHolder().promise;
  // Plotly takes the div's width when it first draws, 700 px if the div is not laid out yet (a view
  // rendered before it is attached: seen in Voila after a reload), and follows only window resizes.
  await laidOut(div);
  note.remove();
  await Plotly.newPlot(div, figureData(s, spec), layoutFor(s, spec), spec.config || {});
  let width = div.clientWidth;
  const resized = new ResizeObserver(() => {
    if (div.clientWidth > 0 && div.clientWidth !== width) {
      width = div.clientWidth;
      Plotly.Plots.resize(div);
    }
  });
  resized.observe(div);
  let queued = false;
  const draw = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      Plotly.react(div, figureData(s, spec), layoutFor(s, spec), spec.config || {});
    });
  };
  s.views.add(draw);
  draw(); // anything that arrived while plotly.js loaded
  return () => {
    s.views.delete(draw);
    resized.disconnect();
    Plotly.purge(div);
  };
}

export default {
  initialize({ model }) {
    if (model.get("kind") === "lib") loadPlotly(model.get("source"));
    else storeFor(model);
  },
  render({ model, el }) {
    if (model.get("kind") === "lib") {
      loadPlotly(model.get("source"));
      return;
    }
    return renderPlot(model, el);
  },
};
