"use strict";
// The dashboard: reads the API with this session's rights every five seconds and draws its
// tables, and charts of the daemon's timeline as SVG made element by element. Text goes in with
// textContent only: nothing the API says is ever parsed as HTML.
(function () {
  const REFRESH_MS = 5000;
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  };
  const cell = (row, key, content) => {
    const td = el("td");
    td.dataset.k = key;
    if (content instanceof Node) td.appendChild(content); else td.textContent = content == null ? "" : String(content);
    row.appendChild(td);
    return td;
  };
  // A name of any length keeps the columns in view: cut with an ellipsis, whole in its tooltip.
  const clip = (text) => {
    const s = el("span", text, "clip");
    s.title = text == null ? "" : String(text);
    return s;
  };
  const bar = (fraction, label) => {
    const b = el("div", null, "bar");
    const fill = el("i");
    fill.style.width = Math.max(0, Math.min(100, fraction * 100)).toFixed(1) + "%";
    b.appendChild(fill);
    b.appendChild(el("span", label));
    return b;
  };
  const gib = (bytes) => (bytes / 1073741824).toFixed(1) + " GiB";
  const age = (ms) => {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d" + Math.floor(s % 86400 / 3600) + "h";
  };
  // Seconds as "0.25s" or "4.2s" under a minute, else as age() says them; "" when unknown.
  const secs = (s) => s == null || !isFinite(s) ? "" : s < 60 ? +s.toFixed(s < 1 ? 2 : 1) + "s" : age(s * 1000);
  const NS = "http://www.w3.org/2000/svg", W = 1000, H = 100;
  const svg = (tag, attrs) => {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  };
  // One chart: `lines` ({name, cls, values: numbers or null for no reading}) over `times`, from 0
  // (bottom) to `top`, labelled with its title, its newest values, its scale and its time span.
  function chart(title, newest, times, lines, top, topLabel) {
    const fig = el("figure", null, "chart");
    const cap = el("figcaption");
    const b = el("b", title);
    b.title = title;
    cap.append(b, el("span", newest, "newest"));
    const plot = el("div", null, "plot");
    const s = svg("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none", role: "img" });
    s.appendChild(svg("title")).textContent = title;
    for (const y of [H / 4, H / 2, H * 3 / 4]) s.appendChild(svg("line", { x1: 0, x2: W, y1: y, y2: y }));
    const t0 = times[0], span = times[times.length - 1] - t0;
    const x = (t) => span > 0 ? (t - t0) / span * W : W;
    for (const line of lines) {
      let pts = [];
      const flush = () => {
        if (pts.length === 1) pts.unshift(Math.max(0, parseFloat(pts[0]) - 4).toFixed(1) + "," + pts[0].split(",")[1]);
        if (pts.length) s.appendChild(svg("polyline", { points: pts.join(" "), class: line.cls }));
        pts = [];
      };
      line.values.forEach((v, i) => {
        if (v == null) return flush();
        pts.push(x(times[i]).toFixed(1) + "," + (H - Math.max(0, Math.min(1, v / top)) * H).toFixed(1));
      });
      flush();
    }
    plot.append(s, el("span", topLabel, "ytop"), el("span", "0", "ybot"));
    const axis = el("div", null, "axis");
    const when = (t) => new Date(t).toLocaleTimeString();
    axis.append(el("span", times.length ? when(t0) : "no samples yet"), el("span", times.length ? when(times[times.length - 1]) : ""));
    const keys = el("div", null, "keys");
    for (const line of lines) {
      const k = el("span", line.name);
      k.prepend(el("i", null, line.cls));
      keys.appendChild(k);
    }
    fig.append(cap, plot, axis, keys);
    return fig;
  }
  const last = (values) => {
    for (let i = values.length - 1; i >= 0; i--) if (values[i] != null) return values[i];
    return null;
  };
  function timeline(t, admin) {
    const times = t.times_ms;
    const covered = times.length > 1 ? age(times[times.length - 1] - times[0]) : "0s";
    document.getElementById("span").textContent = "· last " + covered + " (a sample every " + t.interval_s + "s, kept " + age(t.span_s * 1000) + ")";
    const gpus = t.devices.map((d) => {
      const total = d.memory_total_bytes;
      const mem = d.memory_used_bytes.map((m) => m == null ? null : total ? m / total * 100 : null);
      const u = last(d.utilization_percent), m = last(d.memory_used_bytes);
      const newest = (u == null ? "n/a" : u + "%") + " · " + (m == null ? "n/a" : gib(m) + (total ? " / " + gib(total) : ""));
      const fig = chart("GPU " + d.index + " · " + d.name, newest, times,
        [{ name: "utilization %", cls: "util", values: d.utilization_percent }, { name: "memory used %", cls: "mem", values: mem }], 100, "100%");
      fig.dataset.uuid = d.uuid;
      return fig;
    });
    document.getElementById("gpu-charts").replaceChildren(...gpus);
    const top = Math.max(1, ...t.queued, ...t.running);
    const q = last(t.queued), r = last(t.running);
    const jobs = chart("Jobs" + (admin ? "" : " of your tenants"), (q == null ? 0 : q) + " queued · " + (r == null ? 0 : r) + " running", times,
      [{ name: "queued", cls: "queued", values: t.queued }, { name: "running", cls: "running", values: t.running }], top, top + " jobs");
    jobs.id = "queue";
    document.getElementById("queue-chart").replaceChildren(jobs);
  }
  const active = (j) => j.state === "queued" || j.state === "running";
  // Jobs that ended, newest first, with their accounting when the daemon recorded it.
  function finished(list, devices) {
    const index = new Map(devices.map((d) => [d.uuid, d.index]));
    const now = Date.now();
    let anyAccounting = false;
    const end = (j) => j.ended_at_ms == null ? j.submitted_at_ms : j.ended_at_ms;
    const rows = list.filter((j) => !active(j)).sort((a, b) => end(b) - end(a)).map((j) => {
      const a = j.accounting || null;
      if (a) anyAccounting = true;
      const tr = el("tr");
      tr.dataset.id = j.id;
      cell(tr, "ID", j.array_id != null ? j.array_id + "[" + j.array_task + "]" : j.id);
      cell(tr, "Name", clip(j.name)).className = "name";
      cell(tr, "Tenant", clip(j.tenant));
      const st = cell(tr, "State", j.state);
      st.className = "state-" + j.state;
      st.title = j.reason || "";
      cell(tr, "Exit", j.exit_code == null ? "" : j.exit_code);
      cell(tr, "Ended", age(now - end(j)) + " ago");
      const ms = (from, to) => from == null || to == null ? null : (to - from) / 1000;
      cell(tr, "Wall", secs(a && a.wall_s != null ? a.wall_s : ms(j.started_at_ms, j.ended_at_ms)));
      cell(tr, "Queue wait", secs(a && a.queue_wait_s != null ? a.queue_wait_s : ms(j.submitted_at_ms, j.started_at_ms)));
      const devs = a && a.devices != null ? a.devices : j.devices;
      cell(tr, "Devices", Array.isArray(devs) ? devs.map((u) => index.has(u) ? "GPU " + index.get(u) : u).join(", ") : devs);
      const gs = a && a.gpu_seconds != null ? a.gpu_seconds : j.gpu_seconds;
      cell(tr, "GPU-hours", gs == null ? "" : (gs / 3600).toFixed(gs < 36 ? 4 : 2));
      const peak = a && a.peak_gpu_memory_bytes;
      cell(tr, "Peak GPU memory", peak == null ? "" : gib(peak)).className = "acct";
      const mean = a && a.mean_gpu_utilization;
      cell(tr, "Mean GPU util.", mean == null ? "" : Math.round(mean) + "%").className = "acct";
      return tr;
    });
    document.getElementById("finished").className = anyAccounting ? "" : "noacct";
    return rows;
  }
  const fill = (id, rows) => {
    const body = document.querySelector("#" + id + " tbody");
    body.replaceChildren(...rows);
  };
  async function get(path) {
    const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 401) { window.location.assign("/"); throw new Error("logged out"); }
    if (!r.ok) throw new Error(path + ": " + r.status);
    return r.json();
  }
  // A GPU's STATE as orch devices -v words it: ok, drained (reason), unhealthy: its problems.
  function serviceState(d) {
    const h = d.health || {};
    if (d.state === "unhealthy") return "unhealthy: " + (h.problems || []).map((p) => p.message).join("; ");
    if (d.state === "drained") {
      const drain = (h.drains || []).find((x) => x.uuid === d.uuid) || {};
      return "drained" + (drain.reason ? " (" + drain.reason + ")" : "");
    }
    return d.state || "ok";
  }
  function gpus(devices) {
    const now = Date.now();
    return devices.map((d) => {
      const tr = el("tr");
      tr.dataset.uuid = d.uuid;
      cell(tr, "#", d.index);
      cell(tr, "Device", d.name);
      const u = d.utilization_gpu_percent;
      cell(tr, "Utilization", u == null ? "n/a" : bar(u / 100, u + "%"));
      const used = d.memory_used_bytes, total = d.memory_total_bytes;
      cell(tr, "Memory", used == null || !total ? "n/a" : bar(used / total, gib(used) + " / " + gib(total)));
      cell(tr, "Temp", d.temperature_c == null ? "" : d.temperature_c + " °C");
      const held = (d.held_by || []).map((h) => (h.job_id ? "job " + h.job_id + " " : "") + h.name + (h.tenant ? " (" + h.tenant + ")" : "") + " for " + age(now - h.since_ms));
      cell(tr, "Held by", held.length ? clip(held.join("; ")) : "free").className = held.length ? "holder" : "holder muted";
      const foreign = (d.foreign_processes || []).map((p) => "pid " + p.pid + (p.used_memory_bytes == null ? "" : " (" + gib(p.used_memory_bytes) + ")"));
      cell(tr, "Foreign", foreign.join(", ")).className = foreign.length ? "foreign" : "";
      cell(tr, "State", clip(serviceState(d))).className = "state-" + (d.state || "ok");
      return tr;
    });
  }
  function jobs(list) {
    const now = Date.now();
    return list.map((j) => {
      const tr = el("tr");
      tr.dataset.id = j.id;
      cell(tr, "ID", j.array_id != null ? j.array_id + "[" + j.array_task + "]" : j.id);
      cell(tr, "Name", clip(j.name + (j.alloc ? " (interactive alloc)" : j.interactive ? " (interactive)" : ""))).className = "name";
      cell(tr, "Tenant", clip(j.tenant));
      cell(tr, "State", j.state).className = "state-" + j.state;
      cell(tr, "GPUs", j.gpus);
      cell(tr, "Age", age(now - j.submitted_at_ms));
      cell(tr, "Reason", j.reason || "");
      const events = j.events || [];
      if (events.length) {
        const det = el("details");
        det.appendChild(el("summary", events.length + " event(s)"));
        const ul = el("ul");
        for (const e of events) ul.appendChild(el("li", new Date(e.at_ms).toLocaleTimeString() + " " + e.kind + ": " + e.message));
        det.appendChild(ul);
        cell(tr, "Events", det);
      } else cell(tr, "Events", "");
      return tr;
    });
  }
  function tenants(list) {
    return list.map((t) => {
      const tr = el("tr");
      cell(tr, "Tenant", t.name);
      cell(tr, "Share", (t.normalized_share * 100).toFixed(0) + "%");
      cell(tr, "Usage", bar(t.normalized_usage, (t.normalized_usage * 100).toFixed(0) + "% (" + (t.usage_gpu_seconds / 3600).toFixed(1) + " GPU-h)"));
      cell(tr, "Fair-share", t.fair_share.toFixed(2));
      cell(tr, "GPUs", t.gpus_held + (t.max_gpus == null ? "" : " / " + t.max_gpus));
      cell(tr, "Queued", t.jobs_queued);
      cell(tr, "Running", t.jobs_running);
      return tr;
    });
  }
  async function refresh() {
    const status = document.getElementById("status");
    try {
      const [who, devices, list, ts, t] = await Promise.all([get("/v1/whoami"), get("/v1/devices"), get("/v1/jobs?events=true&all=true&recent=20"), get("/v1/tenants"), get("/v1/timeline?points=240")]);
      document.getElementById("viewer").textContent = "· " + who.name + (who.admin ? " (admin)" : "");
      fill("gpus", gpus(devices));
      timeline(t, who.admin);
      fill("jobs", jobs(list.filter(active).reverse()));
      fill("finished", finished(list, devices));
      fill("tenants", tenants(ts));
      status.textContent = "updated " + new Date().toLocaleTimeString();
      document.body.dataset.ready = "1";
    } catch (e) {
      status.textContent = "could not refresh: " + e.message;
    }
  }
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
