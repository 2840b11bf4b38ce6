/**
 * The workers page (`#/workers`): the fleet, its running tasks and the breakers.
 */
import { api, banner, poll, report } from './api.js';
import { badge, enc, fmtAge, fmtBytes, fmtClock, fmtDuration, h, progressBar, setBadge, setBar, setText, shortId } from './util.js';

export class WorkersView {
  constructor(root) {
    this.root = root;
    this.ctl = new AbortController();
    this.rows = new Map();
    this.timers = [];
  }

  mount() {
    this.tbody = h('tbody');
    this.empty = h('tr', null, h('td', { colspan: 10, class: 'empty' }, 'Loading…'));
    this.tbody.append(this.empty);
    this.count = h('span', { class: 'sub' });
    this.root.replaceChildren(h('section', { class: 'card', id: 'workers' },
      h('div', { class: 'card-head' }, h('h2', null, 'Workers'), this.count),
      h('table', { class: 'grid', id: 'workers-table' },
        h('thead', null, h('tr', null,
          h('th', null, 'Worker'), h('th', null, 'Host'), h('th', null, 'State'),
          h('th', null, 'Queues'), h('th', null, 'Running'), h('th', { class: 'right' }, 'Memory'),
          h('th', { class: 'right' }, 'CPU'), h('th', { class: 'right' }, 'Heartbeat'),
          h('th', { class: 'right' }, 'Missed'), h('th', { class: 'right' }, 'Done / failed'))),
        this.tbody)),
      this.breakersCard());
    poll(() => this.refresh(), 1000, this.ctl.signal);
    // heartbeat ages move between polls
    this.timers.push(setInterval(() => this.tickAges(), 250));
  }

  unmount() {
    this.ctl.abort();
    this.timers.forEach(clearInterval);
  }

  async refresh() {
    try {
      const data = await api('/api/workers', { signal: this.ctl.signal });
      banner.clear('workers');
      this.render(Array.isArray(data.workers) ? data.workers : []);
      this.renderBreakers(Array.isArray(data.breakers) ? data.breakers : []);
    } catch (err) {
      report('workers', err);
    }
  }

  /** The circuit breakers card, shown only while a breaker is open, half-open or counting. */
  breakersCard() {
    this.breakerRows = h('tbody');
    this.breakers = h('section', { class: 'card', id: 'breakers', hidden: true },
      h('div', { class: 'card-head' }, h('h2', null, 'Circuit breakers'),
        h('span', { class: 'sub' }, 'an open breaker holds new dispatches of its queue and task type until its probe')),
      h('table', { class: 'grid', id: 'breakers-table' },
        h('thead', null, h('tr', null,
          h('th', null, 'Queue'), h('th', null, 'Task type'), h('th', null, 'State'),
          h('th', { class: 'right' }, 'Failures in a row'), h('th', { class: 'right' }, 'Probe at'),
          h('th', null, 'Coordinator'))),
        this.breakerRows));
    return this.breakers;
  }

  renderBreakers(breakers) {
    this.breakers.hidden = breakers.length === 0;
    this.breakerRows.replaceChildren(...breakers.map((b) => h('tr', { 'data-breaker': `${b.queue}/${b.task_type}` },
      h('td', { class: 'mono' }, b.queue), h('td', { class: 'mono' }, b.task_type),
      h('td', null, badge(b.state)),
      h('td', { class: 'right num' }, String(b.consecutive_failures)),
      h('td', { class: 'right num' }, b.retry_at_ms ? fmtClock(b.retry_at_ms) : '—'),
      h('td', { class: 'mono' }, b.coordinator || '—'))));
  }

  render(workers) {
    const seen = new Set();
    for (const w of workers) {
      seen.add(w.id);
      let row = this.rows.get(w.id);
      if (!row) {
        row = this.createRow(w.id);
        this.rows.set(w.id, row);
      }
      this.updateRow(row, w);
      this.tbody.append(row.tr);
    }
    for (const [id, row] of this.rows) {
      if (!seen.has(id)) { row.tr.remove(); this.rows.delete(id); }
    }
    if (workers.length === 0) {
      this.empty.firstChild.textContent = 'No workers registered.';
      this.tbody.prepend(this.empty);
    } else this.empty.remove();
    const busy = workers.filter((w) => w.state === 'running').length;
    setText(this.count, `${workers.length} workers, ${busy} running`);
  }

  createRow(id) {
    const c = {
      id: h('td', { class: 'mono' }, id),
      host: h('td'),
      state: badge('idle'),
      queues: h('div', { class: 'chips' }),
      running: h('td'),
      memory: h('td', { class: 'right num' }),
      cpu: h('td', { class: 'right num' }),
      hb: h('td', { class: 'right num hb' }),
      missed: h('td', { class: 'right num missed' }),
      counts: h('td', { class: 'right num counts-cell' }),
    };
    const tr = h('tr', { 'data-worker-id': id },
      c.id, c.host, h('td', null, c.state), h('td', null, c.queues), c.running,
      c.memory, c.cpu, c.hb, c.missed, c.counts);
    return { tr, c, worker: null, key: {} };
  }

  updateRow(row, w) {
    const { c } = row;
    row.worker = w;
    setText(c.host, w.host || '—');
    setBadge(c.state, w.state);
    const queues = (w.queues || []).join('\u0000');
    if (row.key.queues !== queues) {
      row.key.queues = queues;
      c.queues.replaceChildren(...(w.queues || []).map((q) => h('span', { class: 'chip' }, q)));
    }
    const running = JSON.stringify(w.running || []);
    if (row.key.running !== running) {
      row.key.running = running;
      const items = (w.running || []).map((r) => {
        const pct = Math.max(0, Math.min(100, Number(r.progress) || 0));
        // A handler that reports no progress gets how long it has run, not a bar stuck at 0%.
        let progress;
        if (pct > 0) {
          const bar = progressBar();
          setBar(bar.fill, pct);
          progress = [bar.el, h('span', { class: 'pct' }, `${Math.round(pct)}%`)];
        } else {
          progress = [h('span', { class: 'muted run-for', 'data-started-ms': r.started_ms || '' },
            r.started_ms ? `for ${fmtDuration(Date.now() - r.started_ms)}` : '')];
        }
        return h('div', { class: 'run-item' },
          h('span', null,
            h('a', { href: `#/executions/${enc(r.execution_id)}`, title: `execution ${r.execution_id}\ninstance ${r.instance}` },
              h('b', null, r.task_id || shortId(r.instance)), ' · ', r.execution_name || shortId(r.execution_id)),
            r.attempt > 1 ? h('span', { class: 'muted' }, ` attempt ${r.attempt}`) : null),
          ...progress,
          r.step ? h('span', { class: 'step' }, r.step) : null);
      });
      const slots = w.slots != null ? h('div', { class: 'muted', style: 'font-size:12px' }, `${(w.running || []).length} / ${w.slots} slots`) : null;
      c.running.replaceChildren(...items, slots);
    }
    setText(c.memory, fmtBytes(w.memory_bytes));
    setText(c.cpu, w.cpu_percent == null ? '—' : `${Number(w.cpu_percent).toFixed(1)} %`);
    const missed = Number(w.missed_heartbeats) || 0;
    c.missed.classList.toggle('bad', missed > 0);
    if (c.missed.textContent !== String(missed)) c.missed.replaceChildren(h('span', null, String(missed)));
    c.counts.replaceChildren(
      h('span', { class: 'ok' }, String(w.tasks_completed ?? 0)), ' / ',
      h('span', { class: w.tasks_failed > 0 ? 'bad' : '' }, String(w.tasks_failed ?? 0)));
    this.updateAge(row);
  }

  updateAge(row) {
    const w = row.worker;
    if (!w || w.last_heartbeat_ms == null) { setText(row.c.hb, '—'); return; }
    const age = Date.now() - w.last_heartbeat_ms;
    setText(row.c.hb, fmtAge(age));
    row.c.hb.title = new Date(w.last_heartbeat_ms).toLocaleString();
    const stale = w.state !== 'terminated' && w.interval_ms > 0 && age > 2 * w.interval_ms;
    row.c.hb.classList.toggle('stale', stale);
  }

  tickAges() {
    for (const row of this.rows.values()) {
      this.updateAge(row);
      for (const el of row.c.running.querySelectorAll('.run-for[data-started-ms]')) {
        const started = Number(el.dataset.startedMs);
        if (started) setText(el, `for ${fmtDuration(Date.now() - started)}`);
      }
    }
  }
}
