// sia-slurm static report: renders window.SIA_REPORT (written to data.js by `sia-slurm report`)
// into tables and inline SVG charts. No network, no libraries, works from file://.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#3b6fd8", "#e07b39", "#2f9e6e", "#b2459b", "#c9a227", "#5a5f6e", "#d1495b"];

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmt(value, digits) {
    if (value === null || value === undefined || Number.isNaN(value)) return "-";
    if (typeof value !== "number") return String(value);
    return value.toFixed(digits === undefined ? 2 : digits);
  }

  // The unit a time axis or column uses, from the longest time it shows: minutes for a run of
  // a few minutes (the demo's 3-minute jobs read 0.00-0.05 in hours), hours for a day or two,
  // days beyond.
  function timeUnit(maxSeconds) {
    if (maxSeconds <= 2 * 3600) return { div: 60, name: "min" };
    if (maxSeconds <= 72 * 3600) return { div: 3600, name: "h" };
    return { div: 86400, name: "d" };
  }

  // The jobs the page shows: those of the user and account the query string names
  // (?user=alice&account=physics; the filter bar sets it), every job without one.
  function filterOf() {
    const params = new URLSearchParams(window.location.search);
    return { user: params.get("user") || "", account: params.get("account") || "" };
  }

  function shownJobs(data, filter) {
    return (data.jobs || []).filter((j) => (!filter.user || j.user === filter.user)
      && (!filter.account || j.account === filter.account));
  }

  function filterBar(data, filter) {
    const jobs = data.jobs || [];
    const bar = document.getElementById("filters");
    const owned = jobs.some((j) => j.user || j.account);
    if (!owned) { bar.hidden = true; return; }
    for (const key of ["user", "account"]) {
      const select = document.getElementById(`filter-${key}`);
      const names = [...new Set(jobs.map((j) => j[key] || ""))].filter((n) => n).sort();
      select.appendChild(el("option", { value: "" }, `every ${key}`));
      for (const name of names) {
        const option = el("option", { value: name }, name);
        if (name === filter[key]) option.setAttribute("selected", "selected");
        select.appendChild(option);
      }
      select.addEventListener("change", () => {
        const params = new URLSearchParams(window.location.search);
        if (select.value) params.set(key, select.value); else params.delete(key);
        window.location.search = params.toString();
      });
    }
    const shown = shownJobs(data, filter).length;
    document.getElementById("filter-count").textContent =
      shown === jobs.length ? `${jobs.length} jobs` : `${shown} of ${jobs.length} jobs`;
  }

  // GPU-hours per account (and its users): from each job's segments (GPUs x time it held
  // them, as the controller granted them), and Slurm accounting's charge where there is one.
  function accountTable(data) {
    const jobs = data.jobs || [];
    const section = document.getElementById("accounts");
    if (!jobs.some((j) => j.account || j.user)) { section.hidden = true; return; }
    const accounting = jobs.some((j) => typeof j.accounted_gpu_hours === "number");
    const byAccount = new Map();
    for (const j of jobs) {
      const name = j.account || "(none)";
      const row = byAccount.get(name) || { users: new Set(), jobs: 0, held: 0, charged: 0 };
      if (j.user) row.users.add(j.user);
      row.jobs += 1;
      row.held += (j.segments || []).reduce((a, s) => a + (s.end - s.start) * s.gpus, 0) / 3600;
      row.charged += typeof j.accounted_gpu_hours === "number" ? j.accounted_gpu_hours : 0;
      byAccount.set(name, row);
    }
    const head = document.querySelector("#accounts-table thead tr");
    if (accounting) head.appendChild(el("th", { title: "GPU-hours sacct accounted over all the account's jobs' Slurm runs" }, "GPU-h (sacct)"));
    const tbody = document.querySelector("#accounts-table tbody");
    const names = [...byAccount.keys()].sort((a, b) => byAccount.get(b).held - byAccount.get(a).held);
    for (const name of names) {
      const row = byAccount.get(name);
      const tr = el("tr", { class: "account-row" });
      tr.appendChild(el("td", {}, name));
      tr.appendChild(el("td", {}, [...row.users].sort().join(", ") || "-"));
      tr.appendChild(el("td", { class: "num" }, String(row.jobs)));
      tr.appendChild(el("td", { class: "num" }, fmt(row.held, 3)));
      if (accounting) tr.appendChild(el("td", { class: "num" }, fmt(row.charged, 3)));
      tbody.appendChild(tr);
    }
  }

  function colours(types) {
    const map = {};
    types.forEach((t, i) => { map[t] = PALETTE[i % PALETTE.length]; });
    return map;
  }

  // A chart frame: returns {svg, x(v), y(v), plot area} with axes and ticks.
  function frame(container, opts) {
    const width = opts.width || 1100, height = opts.height || 260;
    const m = { l: 56, r: 16, t: 10, b: 34 };
    const svg = svgEl("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    const [x0, x1] = opts.xDomain, [y0, y1] = opts.yDomain;
    const sx = (v) => m.l + ((v - x0) / ((x1 - x0) || 1)) * (width - m.l - m.r);
    const sy = (v) => height - m.b - ((v - y0) / ((y1 - y0) || 1)) * (height - m.t - m.b);
    svg.appendChild(svgEl("line", { x1: m.l, y1: height - m.b, x2: width - m.r, y2: height - m.b, stroke: "#999" }));
    svg.appendChild(svgEl("line", { x1: m.l, y1: m.t, x2: m.l, y2: height - m.b, stroke: "#999" }));
    for (let i = 0; i <= 4; i++) {
      const xv = x0 + (i / 4) * (x1 - x0), yv = y0 + (i / 4) * (y1 - y0);
      svg.appendChild(svgEl("text", { x: sx(xv), y: height - m.b + 14, "text-anchor": "middle" }, fmt(xv, opts.xDigits)));
      svg.appendChild(svgEl("text", { x: m.l - 6, y: sy(yv) + 4, "text-anchor": "end" }, fmt(yv, opts.yDigits)));
    }
    svg.appendChild(svgEl("text", { x: (width + m.l) / 2, y: height - 4, "text-anchor": "middle" }, opts.xLabel));
    svg.appendChild(svgEl("text", { x: 12, y: m.t + 8 }, opts.yLabel));
    container.appendChild(svg);
    return { svg, sx, sy };
  }

  function legend(container, colourOf) {
    const box = el("div", { class: "legend" });
    for (const [name, colour] of Object.entries(colourOf)) {
      const item = el("span", {}, name);
      item.style.setProperty("--swatch", colour);
      box.appendChild(item);
    }
    container.appendChild(box);
  }

  function summary(data) {
    document.getElementById("title").textContent = data.title || "sia-slurm report";
    document.getElementById("subtitle").textContent = data.subtitle || "";
    const dl = document.getElementById("summary");
    for (const item of data.summary || []) {
      const div = el("div");
      div.appendChild(el("dt", {}, item.label));
      div.appendChild(el("dd", {}, String(item.value)));
      dl.appendChild(div);
    }
  }

  function clusterView(data, colourOf) {
    const rounds = data.rounds || [];
    const types = data.gpu_types.map((t) => t.name);
    const tbody = document.querySelector("#cluster-table tbody");
    for (const t of data.gpu_types) {
      const alloc = rounds.map((r) => (r.allocated || {})[t.name] || 0);
      const free = rounds.map((r) => ((r.usable || {})[t.name] ?? t.total) - ((r.allocated || {})[t.name] || 0));
      const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
      const row = el("tr");
      row.appendChild(el("td", {}, t.name));
      row.appendChild(el("td", { class: "num" }, String(t.total)));
      row.appendChild(el("td", { class: "num" }, fmt(mean(alloc), 1)));
      row.appendChild(el("td", { class: "num" }, String(alloc.length ? Math.max(...alloc) : 0)));
      row.appendChild(el("td", { class: "num" }, fmt(mean(free), 1)));
      tbody.appendChild(row);
    }
    const box = document.getElementById("cluster-chart");
    if (!rounds.length) { box.textContent = "no rounds recorded"; return; }
    const unit = timeUnit(rounds[rounds.length - 1].time - rounds[0].time);
    const hours = rounds.map((r) => r.time / unit.div);
    const total = data.gpu_types.reduce((a, t) => a + t.total, 0);
    const f = frame(box, { xDomain: [hours[0], hours[hours.length - 1]], yDomain: [0, total],
      xLabel: `time (${unit.name})`, yLabel: "GPUs", yDigits: 0, xDigits: unit.div === 60 ? 1 : 2 });
    let base = rounds.map(() => 0);
    for (const t of types) {
      const top = rounds.map((r, i) => base[i] + ((r.allocated || {})[t] || 0));
      const pts = hours.map((h, i) => `${f.sx(h)},${f.sy(top[i])}`)
        .concat(hours.slice().reverse().map((h, j) => `${f.sx(h)},${f.sy(base[rounds.length - 1 - j])}`));
      f.svg.appendChild(svgEl("polygon", { points: pts.join(" "), fill: colourOf[t], "fill-opacity": 0.75,
        class: "alloc-area", "data-type": t }));
      base = top;
    }
    legend(box, colourOf);
  }

  function timeline(jobs, colourOf) {
    const box = document.getElementById("timeline-chart");
    jobs = jobs.filter((j) => (j.segments || []).length);
    if (!jobs.length) { box.textContent = "no job has run yet"; return; }
    const end = Math.max(...jobs.flatMap((j) => j.segments.map((s) => s.end)));
    const start = Math.min(...jobs.map((j) => j.submit_time));
    const rowH = 10, height = Math.max(120, jobs.length * rowH + 50);
    const unit = timeUnit(end - start);
    const f = frame(box, { height, xDomain: [start / unit.div, end / unit.div], yDomain: [jobs.length, 0],
      xLabel: `time (${unit.name})`, yLabel: "jobs (by submission)", yDigits: 0, xDigits: unit.div === 60 ? 1 : 2 });
    const maxGpus = Math.max(...jobs.flatMap((j) => j.segments.map((s) => s.gpus)));
    jobs.forEach((job, i) => {
      for (const seg of job.segments) {
        const h = Math.max(2, (rowH - 2) * Math.sqrt(seg.gpus / maxGpus));
        const rect = svgEl("rect", { x: f.sx(seg.start / unit.div), y: f.sy(i + 0.5) - h / 2,
          width: Math.max(1, f.sx(seg.end / unit.div) - f.sx(seg.start / unit.div)), height: h,
          fill: colourOf[seg.gpu_type] || "#888", class: "segment" });
        rect.appendChild(svgEl("title", {}, `${job.id}: ${seg.gpus} x ${seg.gpu_type}`));
        f.svg.appendChild(rect);
      }
    });
    legend(box, colourOf);
  }

  // The job table. Two columns are there only when some job has a value for them:
  // "GPU-h (sacct)" (Slurm accounting's charge over all of a job's runs; a report without
  // accounting, such as a simulation, --db, a cluster without slurmdbd or a data file older
  // than the field, has no number for any job) and "note" (why a job is in its state: the
  // controller's "<stage>: <why>" for a job quarantined in the last round); and "profiling
  // (min)" when some job profiled its model.
  function jobTable(jobs) {
    const tbody = document.querySelector("#jobs-table tbody");
    const head = document.querySelector("#jobs-table thead tr");
    const owned = jobs.some((j) => j.user || j.account);
    const jctUnit = timeUnit(Math.max(0, ...jobs.map((j) => j.jct_s || 0)));
    const accounting = jobs.some((j) => typeof j.accounted_gpu_hours === "number");
    const notes = jobs.some((j) => j.note);
    const profiled = jobs.some((j) => typeof j.profiling_s === "number");
    // Per column: its value, and for a number its digits and cell class. The two goodput
    // columns are one pair (their header titles in index.html; JobRow in
    // sia_slurm/report/report_data.py): both of the shape the job's newest report measured, on that
    // report's statistical efficiency, so they differ by the throughput model's error only.
    const columns = [
      { value: (j) => j.id }, { value: (j) => j.app }, { value: (j) => j.state },
      { value: (j) => j.gpu_type || "-" },
      { value: (j) => j.gpus || 0, digits: 0 }, { value: (j) => j.batch_size || 0, digits: 0 },
      { value: (j) => j.goodput_predicted, digits: 2 }, { value: (j) => j.goodput_measured, digits: 2 },
      { value: (j) => j.restarts || 0, digits: 0 },
      { value: (j) => (j.jct_s === null || j.jct_s === undefined ? null : j.jct_s / jctUnit.div), digits: 2 },
    ];
    document.getElementById("jct-header").textContent = `JCT (${jctUnit.name})`;
    if (owned) {
      head.appendChild(el("th", { class: "owner" }, "user"));
      columns.push({ value: (j) => j.user || "-" });
      head.appendChild(el("th", { class: "owner" }, "account"));
      columns.push({ value: (j) => j.account || "-" });
    }
    if (profiled) {
      head.appendChild(el("th", { class: "profiling", title: "minutes the job spent profiling its model on each GPU type (docs/profiling.md)" }, "profiling (min)"));
      columns.push({ value: (j) => (typeof j.profiling_s === "number" ? j.profiling_s / 60 : null), digits: 1, cls: "num profiling" });
    }
    if (accounting) {
      head.appendChild(el("th", { class: "accounted", title: "GPU-hours sacct accounted over all the job's Slurm runs" }, "GPU-h (sacct)"));
      columns.push({ value: (j) => j.accounted_gpu_hours ?? null, digits: 3, cls: "num accounted" });
    }
    if (notes) {
      head.appendChild(el("th", { class: "note", title: "why the job is in its state (quarantined: the stage that failed, and why)" }, "note"));
      columns.push({ value: (j) => j.note || "", cls: "note" });
    }
    const rows = jobs.map((j) => ({ state: String(j.state), cells: columns.map((c) => c.value(j)) }));
    function draw(sorted) {
      tbody.replaceChildren();
      for (const r of sorted) {
        const tr = el("tr", { class: "job-row", "data-state": r.state });
        r.cells.forEach((v, i) => {
          const c = columns[i], numeric = c.digits !== undefined;
          const cls = c.cls || (numeric ? "num" : undefined);
          tr.appendChild(el("td", cls ? { class: cls } : {}, numeric ? fmt(v, c.digits) : String(v)));
        });
        tbody.appendChild(tr);
      }
    }
    draw(rows);
    document.querySelectorAll("#jobs-table th").forEach((th, i) => {
      let asc = true;
      th.addEventListener("click", () => {
        rows.sort((a, b) => ((a.cells[i] ?? -Infinity) > (b.cells[i] ?? -Infinity) ? 1 : -1) * (asc ? 1 : -1));
        asc = !asc;
        draw(rows);
      });
    });
  }

  function jctCdf(jobs) {
    const box = document.getElementById("jct-chart");
    const seconds = jobs.map((j) => j.jct_s).filter((v) => typeof v === "number");
    if (!seconds.length) { box.textContent = "no job has finished yet"; return; }
    const unit = timeUnit(Math.max(...seconds));
    const jcts = seconds.map((v) => v / unit.div).sort((a, b) => a - b);
    const f = frame(box, { xDomain: [0, jcts[jcts.length - 1]], yDomain: [0, 1], xLabel: `JCT (${unit.name})`, yLabel: "fraction of jobs" });
    const pts = jcts.map((v, i) => `${f.sx(v)},${f.sy((i + 1) / jcts.length)}`);
    f.svg.appendChild(svgEl("polyline", { points: `${f.sx(0)},${f.sy(0)} ` + pts.join(" "), fill: "none", stroke: PALETTE[0], "stroke-width": 2, class: "cdf" }));
  }

  function solveTimes(data) {
    const box = document.getElementById("solve-chart");
    const rounds = (data.rounds || []).filter((r) => typeof r.solve_ms === "number");
    if (!rounds.length) { box.textContent = "no solve times recorded"; return; }
    const ms = rounds.map((r) => r.solve_ms);
    const f = frame(box, { height: 200, xDomain: [rounds[0].index, rounds[rounds.length - 1].index], yDomain: [0, Math.max(...ms)],
      xLabel: "round", yLabel: "solve (ms)", xDigits: 0, yDigits: 0 });
    const pts = rounds.map((r) => `${f.sx(r.index)},${f.sy(r.solve_ms)}`);
    f.svg.appendChild(svgEl("polyline", { points: pts.join(" "), fill: "none", stroke: PALETTE[1], "stroke-width": 1.5 }));
  }

  function main() {
    const data = window.SIA_REPORT;
    if (!data) throw new Error("data.js did not define window.SIA_REPORT");
    const colourOf = colours(data.gpu_types.map((t) => t.name));
    const filter = filterOf();
    const jobs = shownJobs(data, filter);
    summary(data);
    filterBar(data, filter);
    clusterView(data, colourOf);
    accountTable(data);
    timeline(jobs, colourOf);
    jobTable(jobs);
    jctCdf(jobs);
    solveTimes(data);
    document.body.setAttribute("data-rendered", "yes");
  }

  try {
    main();
  } catch (err) {
    const box = document.getElementById("errors");
    box.hidden = false;
    box.textContent = "report error: " + err.message;
    console.error(err);
  }
})();
