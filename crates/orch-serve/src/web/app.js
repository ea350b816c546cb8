"use strict";
// The dashboard: reads the API with this session's rights every five seconds and draws three
// tables. Text goes in with textContent only: nothing the API says is ever parsed as HTML.
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
      return tr;
    });
  }
  function jobs(list) {
    const now = Date.now();
    return list.map((j) => {
      const tr = el("tr");
      tr.dataset.id = j.id;
      cell(tr, "ID", j.array_id != null ? j.array_id + "[" + j.array_task + "]" : j.id);
      cell(tr, "Name", clip(j.name + (j.alloc ? " (alloc)" : j.interactive ? " (interactive)" : ""))).className = "name";
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
      const [who, devices, list, ts] = await Promise.all([get("/v1/whoami"), get("/v1/devices"), get("/v1/jobs?events=true&all=true&recent=20"), get("/v1/tenants")]);
      document.getElementById("viewer").textContent = "· " + who.name + (who.admin ? " (admin)" : "");
      fill("gpus", gpus(devices));
      fill("jobs", jobs(list.slice().reverse()));
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
