/*
 * Trellis monitor UI.
 *
 * A hash-routed single page (`#/`, `#/executions/<id>`, `#/workers`) talking to the monitor's JSON
 * API and to the per-execution Server-Sent Events stream (see API.md). No dependencies.
 *
 * The execution page keeps its data in Maps and renders at most once per animation frame: incoming
 * stream messages only record what changed, and the frame callback patches the DOM (header, DAG
 * nodes, tree lines, event rows) and repaints the timeline canvas.
 */
(() => {
  'use strict';

  // ------------------------------------------------------------------------------------------
  // constants
  // ------------------------------------------------------------------------------------------

  const TASK_STATES = [
    'pending', 'queued', 'blocked', 'running', 'waiting_for_subtasks', 'waiting_for_human',
    'retry_scheduled', 'completed', 'failed', 'skipped', 'cancelled',
  ];
  const EXEC_STATES = [
    'pending', 'running', 'paused', 'waiting_for_human', 'completed', 'failed', 'cancelled',
  ];
  const TERMINAL_EXEC = new Set(['completed', 'failed', 'cancelled']);
  /** Task states an instance does not leave. */
  const TERMINAL_TASK = new Set(['completed', 'failed', 'skipped', 'cancelled']);
  /** Bottom-to-top order of the segments of a wave's stacked bar (settled work at the bottom). */
  const STACK_ORDER = [
    'completed', 'skipped', 'failed', 'cancelled', 'running', 'waiting_for_subtasks',
    'waiting_for_human', 'retry_scheduled', 'blocked', 'queued', 'pending',
  ];
  /** Event kinds after which the execution detail (questions, state, reason) is fetched again. */
  const REFETCH_KINDS = new Set([
    'question_asked', 'question_answered', 'question_expired', 'pause_requested',
    'resume_requested', 'cancel_requested', 'execution_finished',
  ]);
  const EVENT_CATEGORY = {
    task_failed: 'bad', task_lost: 'bad', task_timed_out: 'bad', budget_exhausted: 'bad',
    execution_timed_out: 'bad', task_completed: 'good', execution_finished: 'good',
    question_asked: 'human', question_answered: 'human', question_expired: 'human',
    subtasks_spawned: 'sub', task_dispatched: 'run', task_started: 'run', execution_started: 'run',
    run_started: 'run', pause_requested: 'ctl', resume_requested: 'ctl', cancel_requested: 'ctl',
  };

  const TOKEN_KEY = 'trellis.token';
  const NET_DOWN = 'monitor unreachable, retrying';
  const DAG_NODE_LIMIT = 300;   // above this many plan tasks the DAG is drawn per wave
  const GROUP_SHOW = 50;        // subtask group members listed in the tree
  const ROOT_PAGE = 200;        // root instances listed in the tree before "show more"
  const FILTER_SHOW = 500;      // instances listed when the tree is filtered
  const EVENT_CAP = 1000;       // rows kept in the event log
  const EVENT_PAGE = 500;       // events per page fetched from the stored log

  // ------------------------------------------------------------------------------------------
  // DOM and formatting helpers
  // ------------------------------------------------------------------------------------------

  /**
   * Creates an element. `attrs` keys: `class`, `text`, `on<event>` (listener), `style`, anything
   * else becomes an attribute (`true` = empty attribute, `null`/`false` = omitted).
   */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const [key, value] of Object.entries(attrs)) {
        if (value == null || value === false) continue;
        if (key === 'class') el.className = value;
        else if (key === 'text') el.textContent = value;
        else if (key.startsWith('on') && typeof value === 'function') {
          el.addEventListener(key.slice(2), value);
        } else el.setAttribute(key, value === true ? '' : String(value));
      }
    }
    for (const child of children.flat()) {
      if (child == null || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  const SVG_NS = 'http://www.w3.org/2000/svg';

  /** Creates an SVG element with attributes. */
  function svg(tag, attrs) {
    const el = document.createElementNS(SVG_NS, tag);
    if (attrs) for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
    return el;
  }

  /** Sets text only when it differs (avoids needless layout work). */
  function setText(el, text) {
    const value = text == null ? '' : String(text);
    if (el.textContent !== value) el.textContent = value;
  }

  /** A state as people read it: `waiting_for_subtasks` → `waiting for subtasks`. */
  function stateLabel(state) {
    return String(state).replace(/_/g, ' ');
  }

  function badge(state) {
    return h('span', { class: 'badge', 'data-state': state || 'pending' }, stateLabel(state || 'pending'));
  }

  function setBadge(el, state) {
    const value = state || 'pending';
    if (el.getAttribute('data-state') !== value) el.setAttribute('data-state', value);
    setText(el, stateLabel(value));
  }

  function progressBar() {
    const fill = h('div', { class: 'bar-fill', style: 'width:0%' });
    return { el: h('div', { class: 'bar' }, fill), fill };
  }

  function setBar(fill, percent) {
    const width = `${Math.max(0, Math.min(100, Number(percent) || 0)).toFixed(2)}%`;
    if (fill.style.width !== width) fill.style.width = width;
  }

  const pad = (n, width = 2) => String(n).padStart(width, '0');
  // UUIDv7 ids of one execution share their leading timestamp digits: the last eight tell them apart.
  const shortId = (id) => (id == null ? '' : String(id).replace(/-/g, '').slice(-8));
  const enc = encodeURIComponent;

  function fmtClock(ms, withMillis) {
    const d = new Date(ms);
    const s = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    return withMillis ? `${s}.${pad(d.getMilliseconds(), 3)}` : s;
  }

  /** Clock time for today, date and time otherwise. */
  function fmtDateTime(ms) {
    if (ms == null) return '—';
    const d = new Date(ms);
    if (d.toDateString() === new Date().toDateString()) return fmtClock(ms);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }

  function fmtDuration(ms) {
    if (ms == null || !Number.isFinite(ms)) return '—';
    const v = Math.max(0, ms);
    if (v < 1000) return `${Math.round(v)} ms`;
    const s = v / 1000;
    if (s < 60) return s < 10 ? `${s.toFixed(1)} s` : `${Math.floor(s)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${pad(Math.floor(s % 60))}s`;
    const hr = Math.floor(m / 60);
    if (hr < 24) return `${hr}h ${pad(m % 60)}m`;
    return `${Math.floor(hr / 24)}d ${hr % 24}h`;
  }

  function fmtAge(ms) {
    const v = Math.max(0, ms);
    if (v < 10000) return `${(v / 1000).toFixed(1)} s ago`;
    if (v < 60000) return `${Math.round(v / 1000)} s ago`;
    return `${fmtDuration(v)} ago`;
  }

  function fmtBytes(n) {
    if (n == null || !Number.isFinite(n)) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = n;
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return `${i > 0 && v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
  }

  /** Percent, never rounded up to 100 before the work is done. */
  function fmtPercent(p) {
    if (p == null || !Number.isFinite(Number(p))) return '—';
    const v = Number(p);
    if (v >= 100) return '100%';
    if (v < 10) return `${Math.floor(v * 10) / 10}%`;
    return `${Math.floor(v)}%`;
  }

  /** Wall time from `start` to `end`, or to now while not ended. */
  function span(start, end) {
    if (start == null) return null;
    return (end == null ? Date.now() : end) - start;
  }

  /** Orders instances by creation time, then by arrival order. */
  function byCreated(a, b) {
    return (a.created_ms - b.created_ms) || (a._order - b._order);
  }

  /** Calls `fn` at most once per `ms`, trailing calls coalesced into one. */
  function throttle(fn, ms) {
    let last = 0;
    let timer = null;
    const wrapped = () => {
      const wait = last + ms - Date.now();
      if (timer) return;
      if (wait <= 0) {
        last = Date.now();
        fn();
      } else {
        timer = setTimeout(() => {
          timer = null;
          last = Date.now();
          fn();
        }, wait);
      }
    };
    wrapped.cancel = () => { clearTimeout(timer); timer = null; };
    return wrapped;
  }

  // ------------------------------------------------------------------------------------------
  // banner: API errors and lost connectivity, keyed so each source clears its own message
  // ------------------------------------------------------------------------------------------

  const banner = (() => {
    const el = document.getElementById('banner');
    const messages = new Map();
    function render() {
      if (messages.size === 0) {
        el.hidden = true;
        el.replaceChildren();
        return;
      }
      el.hidden = false;
      el.classList.toggle('net-only', messages.size === 1 && messages.has('net'));
      const list = h('div', { class: 'banner-msgs' });
      const shown = new Set();
      for (const [key, text] of messages) {
        if (shown.has(text)) continue; // several requests often fail for the same reason
        shown.add(text);
        list.append(h('div', { class: 'banner-msg', 'data-key': key }, text));
      }
      const close = h('button', { class: 'banner-close', type: 'button', title: 'dismiss', 'aria-label': 'dismiss' }, '×');
      close.addEventListener('click', () => {
        for (const key of [...messages.keys()]) if (key !== 'net') messages.delete(key);
        render();
      });
      el.replaceChildren(list, close);
    }
    return {
      set(key, text) {
        if (messages.get(key) === text) return;
        messages.set(key, text);
        render();
      },
      clear(key) {
        if (messages.delete(key)) render();
      },
      /** Drops the messages of the previous page. */
      reset() {
        for (const key of [...messages.keys()]) if (key !== 'net') messages.delete(key);
        render();
      },
    };
  })();

  // ------------------------------------------------------------------------------------------
  // token and configuration
  // ------------------------------------------------------------------------------------------

  const token = (() => {
    let memory = '';
    return {
      get() {
        try { return localStorage.getItem(TOKEN_KEY) || ''; } catch (_) { return memory; }
      },
      set(value) {
        memory = value;
        try {
          if (value) localStorage.setItem(TOKEN_KEY, value);
          else localStorage.removeItem(TOKEN_KEY);
        } catch (_) { /* storage unavailable: keep it for this page only */ }
      },
    };
  })();

  /** Moves `?token=` from the address into storage so it does not linger in history. */
  function adoptTokenFromUrl() {
    const params = new URLSearchParams(location.search);
    if (!params.has('token')) return;
    token.set(params.get('token') || '');
    params.delete('token');
    const query = params.toString();
    history.replaceState(history.state, '', location.pathname + (query ? `?${query}` : '') + location.hash);
  }

  /** `controls` is assumed available until `/api/config` says otherwise. */
  const config = { controls: true, version: '', loaded: false };

  /** Controls need a monitor started with a token, and that token entered in the page. */
  function controlsUsable() {
    return config.controls && token.get() !== '';
  }

  /** Why the controls are off, or '' when they are usable. */
  function controlsHint() {
    if (!config.controls) return 'controls disabled: start the monitor with --monitor-token';
    if (!token.get()) return 'enter the monitor\'s token (top right) to use the controls';
    return '';
  }

  /** A refused control in plain words: what to do about it, and that nothing changed. */
  function refusal(what, err) {
    const status = err instanceof ApiError ? err.status : 0;
    if (status === 401) return `The token was refused, so nothing was changed: check the token at the top right.`;
    if (status === 403) return `Not allowed to ${what}: ${err.message}`;
    return `Could not ${what}: ${err.message}`;
  }

  // ------------------------------------------------------------------------------------------
  // API client
  // ------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  const isAbort = (err) => err && err.name === 'AbortError';

  /**
   * Fetches JSON. Non-2xx answers throw an ApiError carrying the server's `error` text; a network
   * failure throws an ApiError with status 0 and raises the "unreachable" banner.
   */
  async function api(path, { method = 'GET', body, signal } = {}) {
    const headers = { Accept: 'application/json' };
    const init = { method, headers, signal, cache: 'no-store' };
    // Controls always need the token; reads too when the monitor forwards tokens.
    const t = token.get();
    if (t) headers.Authorization = `Bearer ${t}`;
    if (method !== 'GET') {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body || {});
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (err) {
      if (isAbort(err)) throw err;
      banner.set('net', NET_DOWN);
      throw new ApiError(0, NET_DOWN);
    }
    banner.clear('net');
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (_) { data = null; }
    }
    if (!res.ok) {
      const msg = data && data.error ? data.error : `${res.status} ${res.statusText || 'error'} (${method} ${path})`;
      throw new ApiError(res.status, msg);
    }
    if (data == null) throw new ApiError(res.status, `unreadable answer from ${path}`);
    return data;
  }

  /** Runs `fn` now and then `ms` after each completion until `signal` aborts. */
  function poll(fn, ms, signal) {
    let timer = null;
    const loop = async () => {
      try { await fn(); } catch (_) { /* reported by fn */ }
      if (!signal.aborted) timer = setTimeout(loop, ms);
    };
    signal.addEventListener('abort', () => clearTimeout(timer));
    loop();
  }

  /** Reports an API failure in the banner under `key` (network loss already has its message). */
  function report(key, err) {
    if (isAbort(err)) return;
    if (err instanceof ApiError && err.status === 0) return;
    banner.set(key, err && err.message ? err.message : String(err));
  }

  // ------------------------------------------------------------------------------------------
  // executions list (#/)
  // ------------------------------------------------------------------------------------------

  /** Filters survive navigation between pages. */
  const listFilters = { state: '', name: '' };

  class ExecutionsView {
    constructor(root) {
      this.root = root;
      this.ctl = new AbortController();
      this.rows = new Map();   // execution id -> {tr, cells, exec}
      this.request = 0;        // answers to older requests are dropped
      this.timers = [];
    }

    mount() {
      const stateSelect = h('select', { id: 'filter-state', 'aria-label': 'filter by state' },
        h('option', { value: '' }, 'all states'),
        EXEC_STATES.map((s) => h('option', { value: s }, s)));
      stateSelect.value = listFilters.state;
      const nameInput = h('input', {
        id: 'filter-name', type: 'search', placeholder: 'filter by name', 'aria-label': 'filter by name',
        value: listFilters.name,
      });
      const refreshSoon = throttle(() => this.refresh(), 250);
      stateSelect.addEventListener('change', () => { listFilters.state = stateSelect.value; this.refresh(); });
      nameInput.addEventListener('input', () => { listFilters.name = nameInput.value; refreshSoon(); });

      this.tbody = h('tbody');
      this.emptyRow = h('tr', { class: 'empty-row' }, h('td', { colspan: 6, class: 'empty' }, 'Loading…'));
      this.tbody.append(this.emptyRow);
      this.count = h('span', { class: 'sub' });
      this.root.replaceChildren(h('section', { class: 'card', id: 'executions' },
        h('div', { class: 'card-head' },
          h('h2', null, 'Executions'), this.count, h('div', { class: 'grow' }),
          h('div', { class: 'filters' }, stateSelect, nameInput)),
        h('table', { class: 'grid', id: 'executions-table' },
          h('thead', null, h('tr', null,
            h('th', null, 'State'), h('th', null, 'Name'), h('th', null, 'Progress'),
            h('th', { class: 'right' }, 'Done'), h('th', { class: 'right' }, 'Duration'),
            h('th', { class: 'right' }, 'Created'))),
          this.tbody)));

      this.tbody.addEventListener('click', (ev) => {
        const tr = ev.target.closest('tr[data-execution-id]');
        if (!tr || ev.target.closest('a') || window.getSelection().toString()) return;
        location.hash = `#/executions/${enc(tr.getAttribute('data-execution-id'))}`;
      });
      poll(() => this.refresh(), 2000, this.ctl.signal);
      this.timers.push(setInterval(() => this.tick(), 1000));
    }

    unmount() {
      this.ctl.abort();
      this.timers.forEach(clearInterval);
    }

    async refresh() {
      const params = new URLSearchParams();
      if (listFilters.state) params.append('state', listFilters.state);
      if (listFilters.name.trim()) params.set('name', listFilters.name.trim());
      const query = params.toString();
      const request = ++this.request;
      try {
        const data = await api(`/api/executions${query ? `?${query}` : ''}`, { signal: this.ctl.signal });
        if (request !== this.request) return;
        banner.clear('list');
        this.render(Array.isArray(data.executions) ? data.executions : []);
      } catch (err) {
        report('list', err);
      }
    }

    render(list) {
      const seen = new Set();
      for (const exec of list) {
        seen.add(exec.id);
        let row = this.rows.get(exec.id);
        if (!row) {
          row = this.createRow(exec.id);
          this.rows.set(exec.id, row);
        }
        this.updateRow(row, exec);
        this.tbody.append(row.tr); // moves existing rows into the server's order
      }
      for (const [id, row] of this.rows) {
        if (!seen.has(id)) {
          row.tr.remove();
          this.rows.delete(id);
        }
      }
      if (list.length === 0) {
        this.emptyRow.firstChild.textContent = listFilters.state || listFilters.name ? 'No execution matches the filters.' : 'No executions yet.';
        this.tbody.prepend(this.emptyRow);
      } else {
        this.emptyRow.remove();
      }
      setText(this.count, `${list.length} shown`);
    }

    createRow(id) {
      const bar = progressBar();
      const cells = {
        state: badge('pending'),
        link: h('a', { href: `#/executions/${enc(id)}` }),
        id: h('span', { class: 'mono' }, shortId(id)),
        fill: bar.fill,
        pct: h('span', { class: 'pct' }),
        done: h('td', { class: 'right num' }),
        duration: h('td', { class: 'right num' }),
        created: h('td', { class: 'right num muted' }),
      };
      const tr = h('tr', { class: 'clickable', 'data-execution-id': id },
        h('td', null, cells.state),
        h('td', { class: 'cell-name' }, cells.link, cells.id),
        h('td', null, h('div', { class: 'progress-cell' }, bar.el, cells.pct)),
        cells.done, cells.duration, cells.created);
      return { tr, cells, exec: null };
    }

    updateRow(row, exec) {
      const { cells } = row;
      row.exec = exec;
      setBadge(cells.state, exec.state);
      cells.fill.parentNode.setAttribute('data-state', exec.state);
      setText(cells.link, exec.name || exec.id);
      setBar(cells.fill, exec.percent);
      setText(cells.pct, fmtPercent(exec.percent));
      setText(cells.done, `${exec.done ?? 0} / ${exec.total ?? 0}`);
      setText(cells.duration, fmtDuration(span(exec.started_at_ms, exec.ended_at_ms)));
      setText(cells.created, fmtDateTime(exec.created_at_ms));
      cells.created.title = exec.created_at_ms ? new Date(exec.created_at_ms).toLocaleString() : '';
    }

    /** Keeps the duration of unfinished executions ticking between refreshes. */
    tick() {
      for (const row of this.rows.values()) {
        const e = row.exec;
        if (e && e.started_at_ms != null && e.ended_at_ms == null) {
          setText(row.cells.duration, fmtDuration(span(e.started_at_ms, null)));
        }
      }
    }
  }

  // ------------------------------------------------------------------------------------------
  // workers (#/workers)
  // ------------------------------------------------------------------------------------------

  class WorkersView {
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

  // ------------------------------------------------------------------------------------------
  // cluster (#/cluster): the coordinators, their shards and load
  // ------------------------------------------------------------------------------------------

  function shardRanges(shards) {
    const sorted = [...(shards || [])].sort((a, b) => a - b);
    const parts = [];
    for (let i = 0; i < sorted.length; i++) {
      const start = sorted[i];
      let end = start;
      while (i + 1 < sorted.length && sorted[i + 1] === end + 1) end = sorted[++i];
      parts.push(start === end ? String(start) : `${start}–${end}`);
    }
    return parts.length ? parts.join(', ') : '—';
  }

  class ClusterView {
    constructor(root) {
      this.root = root;
      this.ctl = new AbortController();
    }

    mount() {
      this.tbody = h('tbody', null, h('tr', null, h('td', { colspan: 6, class: 'empty' }, 'Loading…')));
      this.count = h('span', { class: 'sub' });
      this.root.replaceChildren(h('section', { class: 'card', id: 'cluster' },
        h('div', { class: 'card-head' }, h('h2', null, 'Coordinators'), this.count),
        h('table', { class: 'grid', id: 'cluster-table' },
          h('thead', null, h('tr', null,
            h('th', null, 'Coordinator'), h('th', null, 'Address'), h('th', null, 'Shards'),
            h('th', { class: 'right' }, 'In memory'), h('th', { class: 'right' }, 'Lag'),
            h('th', { class: 'right' }, 'Reported'))),
          this.tbody)));
      poll(() => this.refresh(), 1000, this.ctl.signal);
    }

    unmount() {
      this.ctl.abort();
    }

    async refresh() {
      try {
        const data = await api('/api/cluster', { signal: this.ctl.signal });
        banner.clear('cluster');
        this.render(data);
      } catch (err) {
        report('cluster', err);
      }
    }

    render(data) {
      const coordinators = Array.isArray(data.coordinators) ? data.coordinators : [];
      this.tbody.replaceChildren(...coordinators.map((c) => h('tr', { 'data-coordinator-id': c.id },
        h('td', { class: 'mono' }, c.id),
        h('td', { class: 'mono' }, c.address || '—'),
        h('td', { title: `${(c.shards || []).length} shards` }, `${shardRanges(c.shards)} (${(c.shards || []).length})`),
        h('td', { class: 'right num' }, String(c.executions_in_memory ?? 0)),
        h('td', { class: 'right num' }, String(c.lag ?? 0)),
        h('td', { class: 'right num' }, c.reported_at_ms ? fmtAge(Date.now() - c.reported_at_ms) : '—'))));
      if (coordinators.length === 0) {
        this.tbody.replaceChildren(h('tr', null, h('td', { colspan: 6, class: 'empty' }, 'No coordinator reported.')));
      }
      const unowned = (data.unowned_shards || []).length;
      setText(this.count, `${coordinators.length} coordinators over ${data.shards ?? '?'} shards` +
        (unowned ? `, ${unowned} unheld (${shardRanges(data.unowned_shards)})` : ''));
    }
  }

  // ------------------------------------------------------------------------------------------
  // execution page (#/executions/<id>): components
  // ------------------------------------------------------------------------------------------

  /** Execution header: name, state, progress, facts, controls. */
  class ExecHeader {
    constructor(view) {
      this.view = view;
      const bar = progressBar();
      this.fill = bar.fill;
      bar.el.classList.add('big');
      bar.el.id = 'progress-bar';
      this.fill.id = 'progress-fill';
      const dd = (id) => h('dd', { id }, '—');
      this.f = {
        name: h('h2', { id: 'execution-name' }, view.id),
        state: h('span', { id: 'execution-state', class: 'badge', 'data-state': 'pending' }, 'pending'),
        live: h('span', { id: 'live-status', class: 'live', 'data-live': 'connecting' }, 'connecting'),
        id: h('div', { id: 'execution-id', class: 'exec-id mono' }, view.id),
        percent: h('span', { id: 'progress-percent' }, '—'),
        done: dd('progress-done'),
        eta: dd('eta'),
        run: dd('run-number'),
        wave: dd('execution-wave'),
        duration: dd('execution-duration'),
        created: dd('execution-created'),
        questions: dd('execution-questions'),
        reason: h('div', { id: 'execution-reason', class: 'reason', hidden: true }),
        holds: h('div', { id: 'execution-holds', class: 'holds', hidden: true }),
        counts: h('div', { id: 'execution-counts', class: 'chips' }),
        labels: h('div', { id: 'execution-labels', class: 'chips', style: 'margin-top:6px' }),
      };
      const fact = (label, el) => h('div', null, h('dt', null, label), el);
      this.controls = new Controls(view);
      this.el = h('section', { class: 'card', id: 'exec-header' },
        h('div', { class: 'exec-title' },
          h('a', { class: 'back', href: '#/' }, '← Executions'),
          this.f.name, this.f.state, this.f.live),
        this.f.id,
        h('div', { class: 'exec-progress' }, bar.el, this.f.percent),
        h('dl', { class: 'facts' },
          fact('Done', this.f.done), fact('ETA', this.f.eta), fact('Run', this.f.run),
          fact('Wave', this.f.wave), fact('Duration', this.f.duration),
          fact('Created', this.f.created), fact('Open questions', this.f.questions)),
        this.f.reason, this.f.holds, this.f.counts, this.f.labels,
        this.controls.el);
    }

    render() {
      const e = this.view.execution;
      if (!e) return;
      const f = this.f;
      setText(f.name, e.name || e.id);
      setBadge(f.state, e.state);
      setText(f.id, e.id);
      setBar(this.fill, e.percent);
      this.fill.parentNode.setAttribute('data-state', e.state);
      setText(f.percent, fmtPercent(e.percent));
      setText(f.done, `${e.done ?? 0} / ${e.total ?? 0}`);
      setText(f.eta, e.eta_ms != null && !TERMINAL_EXEC.has(e.state) ? fmtDuration(e.eta_ms) : '—');
      setText(f.run, e.run_number ?? '—');
      setText(f.wave, e.waves ? `${e.wave ?? '—'} / ${e.waves}` : '—');
      setText(f.created, fmtDateTime(e.created_at_ms));
      setText(f.questions, e.open_questions ?? 0);
      const reason = e.reason ? `Reason: ${e.reason}` : '';
      f.reason.hidden = !reason;
      setText(f.reason, reason);
      const countsKey = JSON.stringify(e.counts || {});
      if (countsKey !== this.countsKey) {
        this.countsKey = countsKey;
        const counts = e.counts || {};
        f.counts.replaceChildren(...TASK_STATES.filter((s) => counts[s] > 0).map((s) =>
          h('span', { class: 'chip', 'data-state': s, title: stateLabel(s) }, h('span', { class: 'swatch' }), `${stateLabel(s)} ${counts[s]}`)));
      }
      const labelsKey = JSON.stringify(e.labels || {});
      if (labelsKey !== this.labelsKey) {
        this.labelsKey = labelsKey;
        f.labels.replaceChildren(...Object.entries(e.labels || {}).map(([k, v]) =>
          h('span', { class: 'chip' }, `${k}=${v}`)));
      }
      this.tick();
      this.controls.update();
    }

    tick() {
      const e = this.view.execution;
      if (!e) return;
      setText(this.f.duration, fmtDuration(span(e.started_at_ms, e.ended_at_ms)));
    }

    setLive(status) {
      this.f.live.setAttribute('data-live', status);
      setText(this.f.live, status);
    }
  }

  /** Pause / resume / cancel / retry / checkpoint. The page only changes after the server agrees. */
  class Controls {
    constructor(view) {
      this.view = view;
      this.busy = false;
      const button = (action, label, cls) => h('button', {
        id: `btn-${action}`, type: 'button', class: cls || null, 'data-action': action,
        onclick: () => this.run(action),
      }, label);
      this.buttons = {
        pause: button('pause', 'Pause'),
        resume: button('resume', 'Resume'),
        cancel: button('cancel', 'Cancel', 'danger'),
        retry: button('retry', 'Retry'),
        checkpoint: button('checkpoint', 'Checkpoint'),
      };
      this.reason = h('input', { id: 'control-reason', type: 'text', placeholder: 'reason (optional, pause / cancel)' });
      this.hint = h('span', { id: 'controls-disabled-hint', class: 'hint', hidden: true });
      this.ok = h('span', { id: 'control-ok', class: 'control-ok' });
      this.error = h('div', { id: 'control-error', class: 'control-error', role: 'alert', hidden: true });
      this.el = h('div', null,
        h('div', { class: 'controls', id: 'controls' },
          Object.values(this.buttons), this.reason, this.hint, this.ok),
        this.error);
    }

    /** Enables each control according to the execution state and the monitor configuration. */
    update() {
      const state = this.view.execution ? this.view.execution.state : null;
      const allowed = {
        pause: state === 'running',
        resume: state === 'paused',
        cancel: state != null && !TERMINAL_EXEC.has(state),
        retry: state === 'failed' || state === 'cancelled',
        checkpoint: state != null,
      };
      const usable = controlsUsable();
      for (const [action, btn] of Object.entries(this.buttons)) {
        btn.disabled = !usable || this.busy || !allowed[action];
      }
      this.reason.disabled = !usable;
      const hint = controlsHint();
      setText(this.hint, hint);
      this.hint.hidden = hint === '';
    }

    /** Forgets the last refusal (a new token may well be accepted). */
    clearError() {
      this.error.hidden = true;
      setText(this.error, '');
    }

    async run(action) {
      const view = this.view;
      const body = {};
      const reason = this.reason.value.trim();
      if (reason && (action === 'pause' || action === 'cancel')) body.reason = reason;
      this.busy = true;
      this.update();
      setText(this.ok, '');
      try {
        const answer = await api(`/api/executions/${enc(view.id)}/${action}`, { method: 'POST', body, signal: view.ctl.signal });
        this.clearError();
        this.reason.value = '';
        if (action === 'retry') setText(this.ok, `run ${answer.run_number ?? ''} started`);
        else if (action === 'checkpoint') setText(this.ok, 'checkpoint taken');
        else setText(this.ok, answer.state ? `now ${answer.state}` : 'done');
        if (action === 'checkpoint') view.checkpoints.refresh();
        if (action === 'retry') view.reviveLive();
        view.refetchDetail();
      } catch (err) {
        if (isAbort(err)) return;
        // Shown here only, beside the button: the banner is for what the page reads.
        setText(this.error, refusal(action, err));
        this.error.hidden = false;
      } finally {
        this.busy = false;
        if (view.alive) this.update();
      }
    }
  }

  /** Open questions, one answer form each. Existing forms are kept so typing is never lost. */
  class Questions {
    constructor(view) {
      this.view = view;
      this.forms = new Map(); // question id -> form
      this.count = h('span', { class: 'sub' });
      this.list = h('div', { class: 'q-list' });
      this.empty = h('div', { class: 'empty' }, 'No open questions.');
      this.el = h('section', { class: 'card', id: 'questions', hidden: true },
        h('div', { class: 'card-head' }, h('h3', null, 'Questions'), this.count),
        this.list, this.empty);
    }

    render(questions) {
      const seen = new Set();
      for (const q of questions) {
        seen.add(q.question_id);
        if (!this.forms.has(q.question_id)) {
          const form = this.createForm(q);
          this.forms.set(q.question_id, form);
          this.list.append(form);
        }
      }
      for (const [id, form] of this.forms) {
        // A question answered here stays, with its answer; one answered elsewhere goes.
        if (!seen.has(id) && !form.dataset.answered) { form.remove(); this.forms.delete(id); }
      }
      this.updateAccess();
      this.empty.hidden = questions.length > 0;
      this.el.classList.toggle('has-questions', questions.length > 0);
      // No card at all while nothing was asked.
      this.el.hidden = this.forms.size === 0;
      setText(this.count, questions.length ? `${questions.length} waiting for an answer` : '');
    }

    /** Answering is a control: disabled with the others without a token. */
    updateAccess() {
      for (const form of this.forms.values()) {
        if (!form._pending) form.querySelector('button[type=submit]').disabled = !controlsUsable();
        const error = form.querySelector('.answer-error');
        if (error && error.dataset.auth) { error.hidden = true; delete error.dataset.auth; }
      }
    }

    createForm(q) {
      const options = Array.isArray(q.options) ? q.options : [];
      const input = options.length
        ? h('select', { name: 'answer' }, options.map((o) => h('option', { value: String(o) }, String(o))))
        : h('input', { name: 'answer', type: 'text', placeholder: 'your answer', autocomplete: 'off' });
      const meta = [q.task_id, q.type, q.asked_at_ms ? `asked ${fmtDateTime(q.asked_at_ms)}` : null,
        q.expires_at_ms ? `expires ${fmtDateTime(q.expires_at_ms)}` : null,
        `instance ${shortId(q.task_instance_id)}`].filter(Boolean).join(' · ');
      const error = h('div', { class: 'answer-error', role: 'alert', hidden: true });
      const ok = h('div', { class: 'control-ok', hidden: true });
      const submit = h('button', { type: 'submit', class: 'primary' }, 'Answer');
      const form = h('form', { class: 'answer', 'data-question-id': q.question_id },
        h('div', { class: 'q-text' }, q.text || '(no text)'),
        h('div', { class: 'q-meta' }, meta),
        h('div', { class: 'q-input' }, input, submit),
        error, ok);
      form.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        const answer = input.value;
        if (!options.length && !answer.trim()) {
          setText(error, 'type an answer first');
          error.hidden = false;
          return;
        }
        form._pending = true;
        submit.disabled = true;
        error.hidden = true;
        try {
          await api(`/api/executions/${enc(this.view.id)}/questions/${enc(q.question_id)}/answer`,
            { method: 'POST', body: { answer }, signal: this.view.ctl.signal });
          form.dataset.answered = answer;
          setText(ok, `answered: ${answer}`);
          ok.hidden = false;
          input.disabled = true;
          submit.hidden = true;
          this.view.refetchDetail();
        } catch (err) {
          if (isAbort(err)) return;
          setText(error, refusal('answer', err));
          if (err instanceof ApiError && err.status === 401) error.dataset.auth = '1';
          error.hidden = false;
          submit.disabled = !controlsUsable();
        } finally {
          form._pending = false;
        }
      });
      return form;
    }
  }

  /**
   * The plan as a DAG, one column per wave. Up to DAG_NODE_LIMIT tasks: one SVG node per task with
   * dependency edges, patched per task when its state changes. Above: one column per wave with a
   * stacked bar of state counts, patched per wave.
   */
  class DagView {
    constructor(view) {
      this.view = view;
      this.nodes = new Map();     // task id -> {g, title}
      this.waveEls = [];          // per wave: {segs: {state: rect}, texts: {state: text}, total}
      this.edgesByTask = new Map();
      this.note = h('span', { class: 'sub' });
      this.scroll = h('div', { class: 'dag-scroll' }, h('div', { class: 'empty', style: 'padding:12px' }, 'Loading plan…'));
      this.el = h('section', { class: 'card', id: 'dag' },
        h('div', { class: 'card-head' }, h('h3', null, 'Plan by waves'), this.note),
        this.scroll);
    }

    showError(text) {
      this.scroll.replaceChildren(h('div', { class: 'empty', style: 'padding:12px' }, text));
    }

    /** Builds the drawing once per plan. */
    build() {
      const plan = this.view.plan;
      this.nodes.clear();
      this.waveEls = [];
      this.edgesByTask.clear();
      if (!plan || !plan.columns.length) {
        this.showError('The plan has no tasks.');
        return;
      }
      this.aggregated = plan.tasks.length > DAG_NODE_LIMIT;
      if (this.aggregated) this.buildAggregated(plan);
      else this.buildGraph(plan);
      const waves = plan.columns.length;
      setText(this.note, `${plan.tasks.length} tasks in ${waves} wave${waves === 1 ? '' : 's'}` +
        (this.aggregated ? ` · aggregated per wave (more than ${DAG_NODE_LIMIT} tasks)` : '') +
        (!this.aggregated && plan.conflicts.length ? ' · dashed orange: file conflict' : ''));
    }

    buildGraph(plan) {
      const W = 168, H = 36, GX = 64, GY = 10, PAD = 24, TOP = 40; // PAD leaves room for conflict arcs
      const pos = new Map();
      let rows = 0;
      plan.columns.forEach((ids, c) => {
        ids.forEach((id, r) => pos.set(id, { x: PAD + c * (W + GX), y: TOP + r * (H + GY) }));
        rows = Math.max(rows, ids.length);
      });
      const width = PAD * 2 + plan.columns.length * W + (plan.columns.length - 1) * GX;
      const height = TOP + rows * (H + GY) + PAD;
      const root = svg('svg', { width, height, viewBox: `0 0 ${width} ${height}`, id: 'dag-svg' });
      const edges = svg('g', { class: 'edges' });
      const conflicts = svg('g', { class: 'conflicts' });
      const nodes = svg('g', { class: 'nodes' });

      plan.columns.forEach((ids, c) => {
        const x = PAD + c * (W + GX);
        const label = svg('text', { x, y: 18, class: 'wave-label' });
        label.textContent = `wave ${c + 1}`;
        const sub = svg('text', { x, y: 32, class: 'wave-sub' });
        sub.textContent = `${ids.length} task${ids.length === 1 ? '' : 's'}`;
        root.append(label, sub);
      });

      const addEdge = (from, to, path) => {
        for (const id of [from, to]) {
          if (!this.edgesByTask.has(id)) this.edgesByTask.set(id, []);
          this.edgesByTask.get(id).push(path);
        }
      };
      for (const task of plan.tasks) {
        const b = pos.get(task.id);
        if (!b) continue;
        for (const dep of task.depends_on || []) {
          const a = pos.get(dep);
          if (!a) continue;
          const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
          const dx = Math.max(24, (x2 - x1) / 2);
          const path = svg('path', {
            class: 'edge', 'data-from': dep, 'data-to': task.id,
            d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`,
          });
          edges.append(path);
          addEdge(dep, task.id, path);
        }
      }
      for (const pair of plan.conflicts || []) {
        const a = pos.get(pair[0]);
        const b = pos.get(pair[1]);
        if (!a || !b) continue;
        // same column: an arc bulging left of the column; otherwise a straight dashed line
        const d = a.x === b.x
          ? `M${a.x},${a.y + H / 2} C${a.x - 22},${a.y + H / 2} ${b.x - 22},${b.y + H / 2} ${b.x},${b.y + H / 2}`
          : `M${a.x + W / 2},${a.y + H / 2} L${b.x + W / 2},${b.y + H / 2}`;
        const path = svg('path', { class: 'conflict', d });
        const title = svg('title');
        title.textContent = `file conflict: ${pair[0]} and ${pair[1]}`;
        path.append(title);
        conflicts.append(path);
      }
      for (const task of plan.tasks) {
        const p = pos.get(task.id);
        if (!p) continue;
        const state = this.view.taskState.get(task.id) || 'pending';
        const g = svg('g', { class: 'node', 'data-task-id': task.id, 'data-state': state, transform: `translate(${p.x},${p.y})` });
        const rect = svg('rect', { width: W, height: H, rx: 6, ry: 6 });
        const name = svg('text', { x: 10, y: task.type ? 15 : 22 });
        name.textContent = clip(task.id, 22);
        const title = svg('title');
        g.append(rect, name);
        if (task.type) {
          const type = svg('text', { x: 10, y: 29, class: 'node-type' });
          type.textContent = clip(task.type, 26);
          g.append(type);
        }
        g.append(title);
        nodes.append(g);
        const entry = { g, title, task };
        this.nodes.set(task.id, entry);
        this.setTitle(entry, state);
      }
      root.append(conflicts, edges, nodes);
      // highlight a node's edges on hover
      root.addEventListener('mouseover', (ev) => this.highlight(ev.target.closest('g.node'), true));
      root.addEventListener('mouseout', (ev) => this.highlight(ev.target.closest('g.node'), false));
      // a node opens its task's newest instance in the drawer
      root.addEventListener('click', (ev) => {
        const g = ev.target.closest('g.node');
        if (!g) return;
        const taskId = g.getAttribute('data-task-id');
        const inst = this.view.newestByTask.get(taskId);
        if (inst) this.view.drawer.open(inst.id);
        else this.view.drawer.notStarted(taskId);
      });
      this.scroll.replaceChildren(root);
    }

    highlight(g, on) {
      if (!g) return;
      g.classList.toggle('hl', on);
      for (const path of this.edgesByTask.get(g.getAttribute('data-task-id')) || []) path.classList.toggle('hl', on);
    }

    setTitle(entry, state) {
      const inst = this.view.newestByTask.get(entry.task.id);
      entry.title.textContent = [
        entry.task.id, entry.task.type ? `type ${entry.task.type}` : null, `state ${state}`,
        inst ? `instance ${shortId(inst.id)} · attempt ${inst.attempt}` : 'not started',
        inst && inst.worker ? `worker ${inst.worker}` : null,
        (entry.task.depends_on || []).length ? `depends on ${entry.task.depends_on.join(', ')}` : null,
      ].filter(Boolean).join('\n');
    }

    buildAggregated(plan) {
      const COL = 150, BAR_W = 30, BAR_H = 240, PAD = 16, TOP = 44, LINE = 16;
      const width = PAD * 2 + plan.columns.length * COL;
      const height = TOP + BAR_H + 34;
      const root = svg('svg', { width, height, viewBox: `0 0 ${width} ${height}`, id: 'dag-svg' });
      this.barGeom = { BAR_W, BAR_H, TOP, LINE };
      plan.columns.forEach((ids, c) => {
        const x = PAD + c * COL;
        const g = svg('g', { class: 'wave', 'data-wave': c + 1, transform: `translate(${x},0)` });
        const label = svg('text', { x: 0, y: 18, class: 'wave-label' });
        label.textContent = `wave ${c + 1}`;
        const total = svg('text', { x: 0, y: 34, class: 'wave-sub' });
        total.textContent = `${ids.length} tasks`;
        const frame = svg('rect', { class: 'frame', x: 0, y: TOP, width: BAR_W, height: BAR_H, rx: 3 });
        const segs = {};
        const texts = {};
        for (const s of STACK_ORDER) {
          const rect = svg('rect', { class: 'seg', x: 0, y: TOP + BAR_H, width: BAR_W, height: 0, 'data-state': s, style: `fill:var(--st-${s})` });
          const title = svg('title');
          rect.append(title);
          segs[s] = rect;
          const text = svg('text', { x: BAR_W + 8, y: 0, 'data-state': s });
          text.style.display = 'none';
          texts[s] = text;
        }
        g.append(label, total, ...STACK_ORDER.map((s) => segs[s]), frame, ...STACK_ORDER.map((s) => texts[s]));
        root.append(g);
        this.waveEls.push({ g, segs, texts, size: ids.length });
      });
      this.scroll.replaceChildren(root);
      for (let i = 0; i < this.waveEls.length; i += 1) this.patchWave(i);
    }

    patchWave(index) {
      const el = this.waveEls[index];
      const counts = this.view.waveCounts[index];
      if (!el || !counts) return;
      const { BAR_H, TOP, LINE } = this.barGeom;
      const total = Math.max(1, el.size);
      let y = TOP + BAR_H;
      let line = 0;
      // labels listed top-down in the reverse of the stacking order, so they read like the bar
      for (const s of STACK_ORDER) {
        const n = counts[s] || 0;
        const hgt = (n / total) * BAR_H;
        y -= hgt;
        const rect = el.segs[s];
        rect.setAttribute('y', y.toFixed(2));
        rect.setAttribute('height', hgt.toFixed(2));
        rect.firstChild.textContent = `wave ${index + 1}: ${n} ${s}`;
      }
      for (const s of [...STACK_ORDER].reverse()) {
        const n = counts[s] || 0;
        const text = el.texts[s];
        if (n > 0) {
          text.style.display = '';
          text.setAttribute('y', String(TOP + 11 + line * LINE));
          setText(text, `${n} ${s.replace(/_/g, ' ')}`);
          line += 1;
        } else text.style.display = 'none';
      }
    }

    /** Applies the changes recorded since the last frame. */
    patch(tasks, waves) {
      if (this.aggregated) {
        for (const w of waves) this.patchWave(w);
        return;
      }
      for (const id of tasks) {
        const entry = this.nodes.get(id);
        if (!entry) continue;
        const state = this.view.taskState.get(id) || 'pending';
        if (entry.g.getAttribute('data-state') !== state) entry.g.setAttribute('data-state', state);
        this.setTitle(entry, state);
      }
    }
  }

  function clip(text, max) {
    const s = String(text);
    return s.length > max ? `${s.slice(0, max - 1)}…` : s;
  }

  /** Reads the state colours from the stylesheet so the canvas matches the rest of the page. */
  function stateColors() {
    const css = getComputedStyle(document.documentElement);
    const colors = {};
    for (const s of TASK_STATES) colors[s] = css.getPropertyValue(`--st-${s}`).trim() || '#999';
    return colors;
  }

  /**
   * Gantt chart on a canvas. The canvas has the size of the visible area and sticks to the top of
   * a scroll container whose spacer gives the full height, so only visible rows are painted.
   */
  class Timeline {
    constructor(view) {
      this.view = view;
      this.mode = 'instance';
      this.rows = [];          // instance mode: instance ids; worker mode: {label, items, lanes, y, h}
      this.contentHeight = 0;
      this.layoutDirty = true;
      this.lastLayout = 0;
      this.colors = null;
      this.batch = new Map();  // state -> {solid, faint}: flat [x, y, w, h, ...] lists
      this.AXIS = 26;
      this.ROW = 18;
      this.LANE = 14;
      this.LABEL = 210;

      this.select = h('select', { id: 'timeline-group', 'aria-label': 'group timeline rows' },
        h('option', { value: 'instance' }, 'one row per instance'),
        h('option', { value: 'worker' }, 'one row per worker'));
      this.select.addEventListener('change', () => {
        this.mode = this.select.value;
        this.layoutDirty = true;
        this.scroll.scrollTop = 0;
        this.view.schedule();
      });
      this.info = h('span', { class: 'sub' });
      // horizontal zoom: null = fit the whole execution, else a fixed window [t0, t1]
      this.window = null;
      const zoomBtn = (label, title, fn) => h('button', { type: 'button', title, onclick: fn }, label);
      this.zoomInfo = h('span', { class: 'sub' }, 'ctrl + wheel: zoom · drag: pan');
      const zoom = h('div', { class: 'zoom' },
        zoomBtn('−', 'zoom out', () => this.zoom(2)),
        zoomBtn('+', 'zoom in', () => this.zoom(0.5)),
        zoomBtn('fit', 'show the whole execution', () => { this.window = null; this.view.schedule(); }));
      this.canvas = h('canvas', { class: 'tl-canvas', id: 'timeline-canvas' });
      this.spacer = h('div', { class: 'tl-spacer' });
      this.tip = h('div', { class: 'tl-tip', hidden: true });
      this.scroll = h('div', { class: 'tl-scroll' }, this.canvas, this.spacer);
      this.el = h('section', { class: 'card', id: 'timeline' },
        h('div', { class: 'card-head' }, h('h3', null, 'Timeline'), this.info, h('div', { class: 'grow' }),
          this.zoomInfo, zoom, this.select),
        h('div', { style: 'position:relative' }, this.scroll, this.tip));

      this.scroll.addEventListener('scroll', () => { this.tip.hidden = true; this.view.schedule(); }, { passive: true });
      this.canvas.addEventListener('mousemove', (ev) => {
        // a plain click must not pin the window: panning starts after a few pixels
        if (this.drag && Math.abs(ev.clientX - this.drag.x) > 2) this.pan(ev.clientX);
        else if (!this.drag) this.hover(ev);
      });
      this.canvas.addEventListener('mouseleave', () => { this.tip.hidden = true; });
      this.canvas.addEventListener('click', (ev) => {
        // a click, not the end of a pan, on a bar opens its task
        if (this.downX != null && Math.abs(ev.clientX - this.downX) > 2) return;
        const inst = this.instanceAt(ev);
        if (inst) this.view.drawer.open(inst.id);
      });
      this.canvas.addEventListener('mousedown', (ev) => {
        if (ev.button !== 0 || !this.geom) return;
        const { t0, t1 } = this.geom;
        this.downX = ev.clientX;
        this.drag = { x: ev.clientX, t0, t1 };
        this.tip.hidden = true;
        ev.preventDefault();
      });
      this.onMouseUp = () => { this.drag = null; };
      window.addEventListener('mouseup', this.onMouseUp);
      this.canvas.addEventListener('wheel', (ev) => {
        if (!ev.ctrlKey && !ev.metaKey) {
          if (ev.shiftKey && this.geom) {
            // shift + wheel pans in time
            ev.preventDefault();
            const { t0, t1, plotW } = this.geom;
            const dt = ((ev.deltaY || ev.deltaX) / plotW) * (t1 - t0);
            this.window = [t0 + dt, t1 + dt];
            this.view.schedule();
          }
          return;
        }
        ev.preventDefault();
        const rect = this.canvas.getBoundingClientRect();
        this.zoom(ev.deltaY > 0 ? 1.25 : 0.8, ev.clientX - rect.left);
      }, { passive: false });
      if (window.ResizeObserver) {
        this.resizer = new ResizeObserver(() => this.view.schedule());
        this.resizer.observe(this.scroll);
      }
    }

    destroy() {
      if (this.resizer) this.resizer.disconnect();
      window.removeEventListener('mouseup', this.onMouseUp);
    }

    /** Scales the visible time window by `factor` around the pointer (or the middle). */
    zoom(factor, px) {
      if (!this.geom) return;
      const { t0, t1, x0, plotW } = this.geom;
      const at = px == null ? 0.5 : Math.max(0, Math.min(1, (px - x0) / plotW));
      const anchor = t0 + at * (t1 - t0);
      const width = Math.max(200, (t1 - t0) * factor);
      const full = this.extent();
      if (width >= (full.t1 - full.t0) && factor > 1) {
        this.window = null; // zoomed out past everything: back to fit
      } else {
        this.window = [anchor - at * width, anchor - at * width + width];
      }
      this.view.schedule();
    }

    pan(clientX) {
      const { x, t0, t1 } = this.drag;
      const dt = ((clientX - x) / this.geom.plotW) * (t1 - t0);
      this.window = [t0 - dt, t1 - dt];
      this.view.schedule();
    }

    /** Recomputes rows. Costs a sort of all instances, so it is throttled for large executions. */
    layout() {
      const insts = [...this.view.instances.values()].sort(byCreated);
      if (this.mode === 'instance') {
        this.rows = insts.map((i) => i.id);
        this.contentHeight = this.AXIS + this.rows.length * this.ROW;
      } else {
        const byWorker = new Map();
        for (const inst of insts) {
          const key = inst.worker || '';
          if (!byWorker.has(key)) byWorker.set(key, []);
          byWorker.get(key).push(inst);
        }
        const keys = [...byWorker.keys()].sort((a, b) => (a === '') - (b === '') || a.localeCompare(b));
        let y = this.AXIS;
        this.rows = keys.map((key) => {
          // greedy lanes: concurrent instances of one worker are stacked, not overlapped
          const items = byWorker.get(key).map((inst) => ({
            id: inst.id,
            start: inst.started_ms ?? inst.created_ms,
            end: inst.ended_ms ?? Infinity,
          })).sort((a, b) => a.start - b.start);
          const laneEnds = [];
          for (const it of items) {
            let lane = laneEnds.findIndex((end) => end <= it.start);
            if (lane < 0) { lane = laneEnds.length; laneEnds.push(0); }
            laneEnds[lane] = it.end;
            it.lane = lane;
          }
          const lanes = Math.max(1, laneEnds.length);
          const row = { label: key || '(no worker)', items, lanes, y, h: lanes * this.LANE + 6 };
          y += row.h;
          return row;
        });
        this.contentHeight = y;
      }
      this.rowsMode = this.mode;
      this.layoutDirty = false;
      this.lastLayout = Date.now();
      const n = this.view.instances.size;
      setText(this.info, this.mode === 'instance'
        ? `${n} instance${n === 1 ? '' : 's'}`
        : `${this.rows.length} worker row${this.rows.length === 1 ? '' : 's'} · ${n} instances`);
    }

    /** Time range shown: first creation to last end, or to now while the execution runs. */
    extent() {
      let t0 = Infinity;
      let t1 = -Infinity;
      let open = false;
      for (const inst of this.view.instances.values()) {
        if (inst.created_ms < t0) t0 = inst.created_ms;
        const end = inst.ended_ms ?? inst.started_ms ?? inst.created_ms;
        if (end > t1) t1 = end;
        if (inst.ended_ms == null) open = true;
      }
      const e = this.view.execution;
      if (e && e.started_at_ms != null && e.started_at_ms < t0) t0 = e.started_at_ms;
      if (!Number.isFinite(t0)) { t0 = Date.now() - 60000; t1 = Date.now(); }
      if ((open && !this.view.finished) || (e && !TERMINAL_EXEC.has(e.state) && !this.view.finished)) {
        t1 = Math.max(t1, Date.now());
      }
      if (t1 - t0 < 1000) t1 = t0 + 1000;
      return { t0, t1: t1 + (t1 - t0) * 0.02 };
    }

    draw() {
      const count = this.view.instances.size;
      if (this.layoutDirty) {
        const wait = count > 2000 ? 500 : 100;
        // rows built for the other grouping cannot be drawn: lay out at once after a mode switch
        if (this.rowsMode !== this.mode || Date.now() - this.lastLayout >= wait) this.layout();
        else this.view.scheduleLater(wait);
      }
      if (!this.colors) this.colors = stateColors();
      // the box shrinks for short charts, and caps at 360 px with a scrollbar for long ones
      const boxH = Math.max(120, Math.min(360, this.contentHeight + 2));
      if (this.scroll.style.height !== `${boxH}px`) this.scroll.style.height = `${boxH}px`;
      const W = this.scroll.clientWidth;
      const H = this.scroll.clientHeight;
      if (W <= 0 || H <= 0) return;
      this.spacer.style.height = `${Math.max(0, this.contentHeight - H)}px`;
      const dpr = window.devicePixelRatio || 1;
      if (this.canvas.width !== Math.round(W * dpr) || this.canvas.height !== Math.round(H * dpr)) {
        this.canvas.width = Math.round(W * dpr);
        this.canvas.height = Math.round(H * dpr);
        this.canvas.style.height = `${H}px`;
      }
      const ctx = this.canvas.getContext('2d');
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, W, H);
      ctx.font = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
      ctx.textBaseline = 'middle';

      const { t0, t1 } = this.window ? { t0: this.window[0], t1: this.window[1] } : this.extent();
      const x0 = this.LABEL;
      const plotW = Math.max(50, W - x0 - 10);
      const xOf = (t) => x0 + ((t - t0) / (t1 - t0)) * plotW;
      this.geom = { t0, t1, x0, plotW, W, H };
      const now = Date.now();
      const top = this.scroll.scrollTop;
      const ticks = axisTicks(t0, t1, plotW);

      // zebra stripes, grid lines, then bars clipped to the plot area, then labels
      const visible = this.visibleRows(top, H);
      ctx.fillStyle = '#f8f9fb';
      for (const row of visible) if (row.index % 2 === 1) ctx.fillRect(0, row.y, W, row.h);
      ctx.strokeStyle = '#e9edf2';
      ctx.lineWidth = 1;
      ctx.beginPath();
      for (const t of ticks.values) {
        const x = Math.round(xOf(t)) + 0.5;
        if (x < x0) continue;
        ctx.moveTo(x, this.AXIS);
        ctx.lineTo(x, H);
      }
      ctx.stroke();
      ctx.save();
      ctx.beginPath();
      ctx.rect(x0, this.AXIS, W - x0, H - this.AXIS);
      ctx.clip();
      for (const row of visible) this.drawRowBars(ctx, row, xOf, now, t0, t1);
      this.flushBars(ctx);
      ctx.restore();
      for (const row of visible) this.drawRowLabel(ctx, row);

      // now marker
      if (!this.view.finished && now <= t1 && now >= t0) {
        const x = Math.round(xOf(now)) + 0.5;
        ctx.strokeStyle = 'rgba(212, 63, 63, 0.7)';
        ctx.setLineDash([3, 3]);
        ctx.beginPath();
        ctx.moveTo(x, this.AXIS);
        ctx.lineTo(x, H);
        ctx.stroke();
        ctx.setLineDash([]);
      }

      // axis, painted last so rows scroll under it
      ctx.fillStyle = '#f7f9fb';
      ctx.fillRect(0, 0, W, this.AXIS);
      ctx.strokeStyle = '#dfe4ea';
      ctx.beginPath();
      ctx.moveTo(0, this.AXIS + 0.5);
      ctx.lineTo(W, this.AXIS + 0.5);
      ctx.moveTo(x0 - 0.5, 0);
      ctx.lineTo(x0 - 0.5, H);
      ctx.stroke();
      ctx.fillStyle = '#637083';
      ctx.textAlign = 'center';
      for (const t of ticks.values) {
        const x = xOf(t);
        if (x < x0 + 20 || x > W - 20) continue;
        ctx.fillText(ticks.label(t), x, this.AXIS / 2);
      }
      ctx.textAlign = 'left';
      ctx.fillText(this.mode === 'instance' ? 'task · instance' : 'worker', 10, this.AXIS / 2);
      if (count === 0) {
        ctx.fillStyle = '#97a1ae';
        ctx.fillText('No task instances yet.', x0 + 12, this.AXIS + 18);
      }
    }

    /**
     * Queues one bar: faint from creation to start (waiting; only with `withWait`), solid from
     * start to end (or now); never started: faint from creation to end (or now).
     * Bars are collected per state and painted by flushBars() with one fill style per state.
     */
    drawBar(inst, y, barH, xOf, now, withWait) {
      const lim = this.geom.W + 10;
      const clamp = (x) => (x < -10 ? -10 : x > lim ? lim : x);
      const end = clamp(xOf(inst.ended_ms ?? now));
      if (end < this.geom.x0) return; // entirely left of the window
      const created = clamp(xOf(inst.created_ms));
      if (created > lim - 10) return; // entirely right of it
      let batch = this.batch.get(inst.state);
      if (!batch) {
        batch = { solid: [], faint: [] };
        this.batch.set(inst.state, batch);
      }
      if (inst.started_ms != null) {
        const start = clamp(xOf(inst.started_ms));
        if (withWait && start - created >= 1) batch.faint.push(created, y + barH * 0.3, start - created, barH * 0.4);
        batch.solid.push(start, y, Math.max(2, end - start), barH);
      } else {
        batch.faint.push(created, y + barH * 0.2, Math.max(2, end - created), barH * 0.6);
      }
    }

    flushBars(ctx) {
      for (const [state, batch] of this.batch) {
        ctx.fillStyle = this.colors[state] || '#999';
        ctx.globalAlpha = 0.4;
        const f = batch.faint;
        for (let i = 0; i < f.length; i += 4) ctx.fillRect(f[i], f[i + 1], f[i + 2], f[i + 3]);
        ctx.globalAlpha = 1;
        const b = batch.solid;
        for (let i = 0; i < b.length; i += 4) ctx.fillRect(b[i], b[i + 1], b[i + 2], b[i + 3]);
      }
      this.batch.clear();
    }

    /** Rows intersecting the visible area, with their on-canvas position. */
    visibleRows(top, H) {
      const out = [];
      if (this.mode === 'instance') {
        const ROW = this.ROW;
        const first = Math.max(0, Math.floor(top / ROW));
        const last = Math.min(this.rows.length, Math.ceil((top + H - this.AXIS) / ROW) + 1);
        for (let i = first; i < last; i += 1) {
          const inst = this.view.instances.get(this.rows[i]);
          if (inst) out.push({ index: i, y: this.AXIS + i * ROW - top, h: ROW, inst });
        }
        return out;
      }
      const rows = this.rows;
      // binary search for the first row reaching into the visible area
      let lo = 0;
      let hi = rows.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (rows[mid].y + rows[mid].h - this.AXIS <= top) lo = mid + 1;
        else hi = mid;
      }
      for (let i = lo; i < rows.length; i += 1) {
        const y = rows[i].y - top;
        if (y > H) break;
        out.push({ index: i, y, h: rows[i].h, worker: rows[i] });
      }
      return out;
    }

    drawRowLabel(ctx, row) {
      const mid = row.y + Math.min(row.h, 20) / 2;
      ctx.fillStyle = '#1d2733';
      if (row.inst) {
        const label = clip(row.inst.task_id, 22);
        ctx.fillText(label, 10, mid);
        const w = ctx.measureText(label).width;
        ctx.fillStyle = '#97a1ae';
        ctx.fillText(shortId(row.inst.id), Math.min(10 + w + 6, this.LABEL - 60), mid);
      } else {
        ctx.fillText(clip(row.worker.label, 26), 10, mid);
      }
    }

    drawRowBars(ctx, row, xOf, now, t0, t1) {
      if (row.inst) {
        this.drawBar(row.inst, row.y + 4, this.ROW - 8, xOf, now, true);
        return;
      }
      for (const it of row.worker.items) {
        const inst = this.view.instances.get(it.id);
        if (!inst) continue;
        if ((inst.ended_ms ?? now) < t0 || inst.created_ms > t1) continue;
        // a worker's lane shows only its own run time, not the wait before dispatch
        this.drawBar(inst, row.y + 3 + it.lane * this.LANE, this.LANE - 3, xOf, now, false);
      }
    }

    /** Tooltip for the instance under the pointer. */
    hover(ev) {
      const inst = this.instanceAt(ev);
      if (!inst) { this.tip.hidden = true; return; }
      this.showTip(ev, inst);
    }

    /** The instance whose bar is under the pointer, or null. */
    instanceAt(ev) {
      if (!this.geom) return null;
      const rect = this.canvas.getBoundingClientRect();
      const x = ev.clientX - rect.left;
      const y = ev.clientY - rect.top;
      const top = this.scroll.scrollTop;
      let inst = null;
      if (y > this.AXIS) {
        const { t0, t1, x0, plotW } = this.geom;
        const t = t0 + ((x - x0) / plotW) * (t1 - t0);
        if (this.mode === 'instance') {
          const i = Math.floor((y - this.AXIS + top) / this.ROW);
          inst = this.view.instances.get(this.rows[i]) || null;
        } else {
          const cy = y + top;
          const row = this.rows.find((r) => cy >= r.y && cy < r.y + r.h);
          if (row) {
            const lane = Math.floor((cy - row.y - 3) / this.LANE);
            const slack = ((t1 - t0) / plotW) * 3;
            const now = Date.now();
            const hit = row.items.find((it) => {
              const i = this.view.instances.get(it.id);
              return i && it.lane === lane && t >= i.created_ms - slack && t <= (i.ended_ms ?? now) + slack;
            });
            if (hit) inst = this.view.instances.get(hit.id);
          }
        }
      }
      return inst;
    }

    showTip(ev, inst) {
      const rect = this.canvas.getBoundingClientRect();
      const x = ev.clientX - rect.left;
      const y = ev.clientY - rect.top;
      const dur = span(inst.started_ms, inst.ended_ms);
      this.tip.replaceChildren(
        h('div', null, h('b', null, inst.task_id), ' ', badge(inst.state)),
        h('div', { class: 'mono' }, inst.id),
        h('div', null, `attempt ${inst.attempt ?? '—'} · run ${inst.run ?? '—'}${inst.worker ? ` · ${inst.worker}` : ''}`),
        h('div', null, `created ${fmtClock(inst.created_ms, true)}` +
          (inst.dispatched_ms != null ? ` · dispatched ${fmtClock(inst.dispatched_ms, true)}` : '') +
          (inst.started_ms != null ? ` · started ${fmtClock(inst.started_ms, true)}` : '') +
          (inst.ended_ms != null ? ` · ended ${fmtClock(inst.ended_ms, true)}` : '')),
        inst.dispatched_ms != null && inst.started_ms != null
          ? h('div', null, `waited ${fmtDuration(span(inst.dispatched_ms, inst.started_ms))} in the queue`) : null,
        dur != null ? h('div', null, `ran ${fmtDuration(dur)}`) : null,
        inst.error ? h('div', { class: 'err' }, inst.error) : null,
        ...(inst.validation || []).map((c) => h('div', { class: c.passed ? 'meta' : 'err' },
          `check ${c.name} (${c.level}) ${c.passed ? 'passed' : 'failed'} in ${fmtDuration(c.duration_ms)}`)),
        ...(inst.earlier_attempts || []).map((a) => h('div', { class: 'meta' },
          `attempt ${a.attempt}${a.worker_id ? ` on ${a.worker_id}` : ''}: ${a.error}`)));
      this.tip.hidden = false;
      const box = this.scroll.getBoundingClientRect();
      const left = Math.min(x + 14, box.width - this.tip.offsetWidth - 4);
      this.tip.style.left = `${Math.max(4, left)}px`;
      this.tip.style.top = `${Math.min(y + 14, box.height - 10)}px`;
    }
  }

  /** Tick positions (about one per 100 px) and their label format for a time range. */
  function axisTicks(t0, t1, width) {
    const steps = [100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5,
      36e5, 72e5, 108e5, 216e5, 432e5, 864e5];
    const per = (t1 - t0) / Math.max(1, width / 100);
    const step = steps.find((s) => s >= per) || steps[steps.length - 1];
    // align to local midnight so hour steps land on round hours
    const offset = new Date(t0).getTimezoneOffset() * 60000;
    const values = [];
    for (let t = Math.ceil((t0 - offset) / step) * step + offset; t <= t1; t += step) values.push(t);
    const label = step < 1000 ? (t) => fmtClock(t, true).slice(3, 12)
      : step < 6e4 ? (t) => fmtClock(t)
        : step < 864e5 ? (t) => fmtClock(t).slice(0, 5)
          : (t) => fmtDateTime(t);
    return { values, label };
  }

  /**
   * The execution tree: roots, subtask groups nested under the instance that spawned them, resumed
   * parents after their group, continuations after the instance they continue. Rebuilt when the
   * structure changes (throttled); state changes of visible lines are patched in place.
   */
  class TreeView {
    constructor(view) {
      this.view = view;
      this.collapsed = new Set();
      this.lines = new Map();     // instance id -> line refs (lines currently shown)
      this.nodes = new Map();     // element cache of the last build, see build()
      this.needsBuild = true;
      this.lastBuild = 0;
      this.rootLimit = ROOT_PAGE;
      this.groupStart = new Map(); // "<instance>:<group>" -> index of the first member shown
      this.info = h('span', { class: 'sub' });
      this.body = h('div', { class: 'tree-body', id: 'tree-body' });
      const expand = h('button', { type: 'button', class: 'link', onclick: () => { this.collapsed.clear(); this.rebuildNow(); } }, 'expand all');
      const collapse = h('button', {
        type: 'button', class: 'link',
        onclick: () => {
          for (const inst of this.view.instances.values()) if (inst.parent) this.collapsed.add(inst.parent);
          this.rebuildNow();
        },
      }, 'collapse all');
      // Filters: a state and a part of the task id; either set lists the matching instances flat.
      this.stateFilter = h('select', { id: 'tree-state-filter', 'aria-label': 'Only instances in this state' },
        h('option', { value: '' }, 'all states'),
        ...TASK_STATES.map((state) => h('option', { value: state }, stateLabel(state))));
      this.nameFilter = h('input', { id: 'tree-name-filter', type: 'search', placeholder: 'task id contains…', 'aria-label': 'Only tasks whose id contains' });
      this.stateFilter.addEventListener('change', () => this.rebuildNow());
      this.nameFilter.addEventListener('input', () => this.rebuildNow());
      this.el = h('section', { class: 'card', id: 'tree' },
        h('div', { class: 'card-head' }, h('h3', null, 'Execution tree'), this.info, h('div', { class: 'grow' }),
          this.stateFilter, this.nameFilter, expand, collapse),
        this.body);
      this.body.addEventListener('click', (ev) => {
        const toggle = ev.target.closest('.tree-toggle');
        if (toggle && !toggle.classList.contains('leaf')) {
          const id = toggle.closest('.tree-line').getAttribute('data-instance-id');
          if (this.collapsed.has(id)) this.collapsed.delete(id);
          else this.collapsed.add(id);
          this.rebuildNow();
          return;
        }
        const more = ev.target.closest('.tree-more-roots');
        if (more) {
          this.rootLimit += ROOT_PAGE;
          this.rebuildNow();
          return;
        }
        const pager = ev.target.closest('.tree-pager');
        if (pager) {
          const key = pager.getAttribute('data-key');
          const start = this.groupStart.get(key) || 0;
          if (ev.target.closest('.tree-page-next')) this.pageTo(key, start + GROUP_SHOW);
          else if (ev.target.closest('.tree-page-prev')) this.pageTo(key, start - GROUP_SHOW);
          else if (ev.target.closest('.tree-jump-go')) this.jump(pager);
          return;
        }
        const line = ev.target.closest('.tree-line');
        if (line) this.view.drawer.open(line.getAttribute('data-instance-id'));
      });
      this.body.addEventListener('keydown', (ev) => {
        if (ev.key === 'Enter' && ev.target.classList.contains('tree-jump')) {
          this.jump(ev.target.closest('.tree-pager'));
        }
      });
    }

    /** Shows a group's members from index `start` on (clamped when the page is built). */
    pageTo(key, start) {
      this.groupStart.set(key, Math.max(0, start));
      this.rebuildNow();
    }

    /** Shows the page holding the member number typed in a group's pager (1-based). */
    jump(pager) {
      const n = Number(pager.querySelector('.tree-jump').value);
      const total = Number(pager.getAttribute('data-total')) || 0;
      if (!Number.isInteger(n) || n < 1 || n > total) {
        setText(pager.querySelector('.tree-jump-error'), `enter a member from 1 to ${total}`);
        return;
      }
      setText(pager.querySelector('.tree-jump-error'), '');
      this.pageTo(pager.getAttribute('data-key'), n - 1);
    }

    rebuildNow() {
      this.needsBuild = true;
      this.lastBuild = 0;
      this.view.schedule();
    }

    /** Called once per frame with the ids of instances changed since the previous frame. */
    update(changed) {
      for (const id of changed) {
        const line = this.lines.get(id);
        if (line) this.patchLine(line, this.view.instances.get(id));
        // a change to an instance that is not shown may alter a "… and N more" count
        else this.needsBuild = true;
      }
      if (!this.needsBuild) return;
      const wait = this.view.instances.size > 2000 ? 1000 : 150;
      if (Date.now() - this.lastBuild < wait) {
        this.view.scheduleLater(wait);
        return;
      }
      this.build();
    }

    build() {
      this.needsBuild = false;
      this.lastBuild = Date.now();
      const insts = this.view.instances;
      const groupParent = new Map();   // group id -> id of the instance that spawned it
      for (const inst of insts.values()) {
        if (inst.parent && inst.group && insts.has(inst.parent)) groupParent.set(inst.group, inst.parent);
      }
      const groupsOf = new Map();      // parent id -> Map(group id -> members)
      const resumedAfter = new Map();  // group id -> resumed instances
      const continuedBy = new Map();   // instance id -> continuing instances
      const roots = [];
      const push = (map, key, value) => {
        let list = map.get(key);
        if (!list) { list = []; map.set(key, list); }
        list.push(value);
      };
      for (const inst of insts.values()) {
        if (inst.continues && inst.continues !== inst.id && insts.has(inst.continues)) push(continuedBy, inst.continues, inst);
        else if (inst.resumed_after && groupParent.has(inst.resumed_after)) push(resumedAfter, inst.resumed_after, inst);
        else if (inst.parent && insts.has(inst.parent)) {
          let groups = groupsOf.get(inst.parent);
          if (!groups) { groups = new Map(); groupsOf.set(inst.parent, groups); }
          push(groups, inst.group || '', inst);
        } else roots.push(inst);
      }
      roots.sort(byCreated);

      // Elements are keyed and reused between builds ("l:" lines, "n:" notes, "g:" group
      // headers, "m:" more-lines), so a rebuild only creates what is new and moves what moved.
      const cache = this.nodes;
      const nodes = new Map();
      const order = [];
      const lines = new Map();
      const visited = new Set();   // guards against malformed cycles
      const sorted = (list) => list.sort(byCreated);
      const indent = (depth) => `${6 + depth * 20}px`;
      const take = (key, make) => {
        const el = nodes.get(key) || cache.get(key) || make();
        nodes.set(key, el);
        order.push(el);
        return el;
      };
      const textLine = (key, cls, depth, text) => {
        const el = take(key, () => h('div', { class: cls }));
        if (el.style.paddingLeft !== indent(depth)) el.style.paddingLeft = indent(depth);
        setText(el, text);
        return el;
      };

      const renderInst = (inst, depth, tag, tagClass) => {
        if (visited.has(inst.id)) return;
        visited.add(inst.id);
        const groups = groupsOf.get(inst.id);
        const open = !this.collapsed.has(inst.id);
        if (tag) textLine(`n:${inst.id}`, `tree-note${tagClass ? ` ${tagClass}` : ''}`, depth, `↳ ${tag}`);
        const refs = this.lineFor(inst, cache, depth, groups ? (open ? 'open' : 'closed') : 'leaf');
        nodes.set(`l:${inst.id}`, refs);
        order.push(refs.el);
        lines.set(inst.id, refs);
        if (groups) {
          for (const [gid, members] of groups) {
            sorted(members);
            if (open) {
              const g = textLine(`g:${inst.id}:${gid}`, 'tree-group', depth + 1,
                `subtask group ${gid ? shortId(gid) : '—'} · ${members.length} member${members.length === 1 ? '' : 's'}`);
              if (gid) g.setAttribute('data-group-id', gid);
              const key = `${inst.id}:${gid}`;
              const start = Math.min(this.groupStart.get(key) || 0, Math.max(0, members.length - GROUP_SHOW));
              if (start > 0) {
                const before = members.slice(0, start);
                textLine(`b:${key}`, 'tree-more', depth + 1, `… ${before.length} earlier (${countStates(before)})`);
              }
              for (const m of members.slice(start, start + GROUP_SHOW)) renderInst(m, depth + 1);
              if (members.length > GROUP_SHOW) {
                const rest = members.slice(start + GROUP_SHOW);
                const pager = take(`m:${key}`, () => h('div', { class: 'tree-more tree-pager', 'data-key': key },
                  h('span', { class: 'tree-page-info' }), ' ',
                  h('button', { type: 'button', class: 'link tree-page-prev' }, `previous ${GROUP_SHOW}`), ' ',
                  h('button', { type: 'button', class: 'link tree-page-next' }, `next ${GROUP_SHOW}`), ' · member ',
                  h('input', { type: 'number', class: 'tree-jump', min: 1, 'aria-label': 'jump to member' }), ' ',
                  h('button', { type: 'button', class: 'link tree-jump-go' }, 'go'), ' ',
                  h('span', { class: 'err tree-jump-error' })));
                if (pager.style.paddingLeft !== indent(depth + 1)) pager.style.paddingLeft = indent(depth + 1);
                pager.setAttribute('data-total', String(members.length));
                setText(pager.querySelector('.tree-page-info'),
                  `members ${start + 1}–${Math.min(start + GROUP_SHOW, members.length)} of ${members.length}` +
                  (rest.length ? ` · ${rest.length} later (${countStates(rest)})` : ''));
                pager.querySelector('.tree-page-prev').disabled = start === 0;
                pager.querySelector('.tree-page-next').disabled = rest.length === 0;
              }
            }
            for (const r of sorted(resumedAfter.get(gid) || [])) renderInst(r, depth, `resumed after group ${shortId(gid)}`, '');
          }
        }
        for (const c of sorted(continuedBy.get(inst.id) || [])) renderInst(c, depth, `continues ${shortId(inst.id)}`, 'cont');
      };

      const state = this.stateFilter.value;
      const name = this.nameFilter.value.trim().toLowerCase();
      if (state || name) {
        // Filtered: the matching instances, oldest first, flat.
        const matching = [...insts.values()]
          .filter((inst) => (!state || inst.state === state) && (!name || inst.task_id.toLowerCase().includes(name)))
          .sort(byCreated);
        for (const inst of matching.slice(0, FILTER_SHOW)) {
          const refs = this.lineFor(inst, cache, 0, 'leaf');
          nodes.set(`l:${inst.id}`, refs);
          order.push(refs.el);
          lines.set(inst.id, refs);
        }
        textLine('f:count', 'tree-more tree-filter-count', 0, matching.length === 0 ? 'No task instance matches the filter.'
          : `${matching.length} matching` + (matching.length > FILTER_SHOW ? ` (the first ${FILTER_SHOW} listed)` : ''));
      } else {
        const shownRoots = roots.slice(0, this.rootLimit);
        for (const r of shownRoots) renderInst(r, 0);
        if (roots.length > shownRoots.length) {
          const rest = roots.slice(shownRoots.length);
          const el = take('m:roots', () => h('div', { class: 'tree-more', style: `padding-left:${indent(0)}` },
            h('span'), ' ', h('button', { type: 'button', class: 'link tree-more-roots' }, 'show more')));
          setText(el.firstChild, `… and ${rest.length} more (${countStates(rest)})`);
        }
      }
      if (insts.size === 0) take('empty', () => h('div', { class: 'empty' }, 'No task instances yet.'));

      // reconcile: drop what is gone, then put the rest in order (a no-op when nothing moved)
      for (const [key, value] of cache) {
        if (!nodes.has(key)) (value.el || value).remove();
      }
      let cursor = this.body.firstChild;
      for (const el of order) {
        if (el === cursor) cursor = cursor.nextSibling;
        else this.body.insertBefore(el, cursor);
      }
      while (cursor) {
        const next = cursor.nextSibling;
        cursor.remove();
        cursor = next;
      }
      this.nodes = nodes;
      this.lines = lines;
      setText(this.info, `${insts.size} instance${insts.size === 1 ? '' : 's'} · ${roots.length} root${roots.length === 1 ? '' : 's'}`);
    }

    /** Returns the line of `inst`, reused from the previous build when possible. */
    lineFor(inst, cache, depth, kind) {
      let refs = cache.get(`l:${inst.id}`);
      if (!refs) {
        refs = {
          toggle: h('button', { type: 'button', class: 'tree-toggle' }),
          badge: badge(inst.state),
          attempt: h('span', { class: 'meta' }),
          worker: h('span', { class: 'meta mono' }),
          dur: h('span', { class: 'dur' }),
          depth: -1,
          kind: '',
          inst,
        };
        refs.el = h('div', { class: 'tree-line', 'data-instance-id': inst.id, 'data-state': inst.state },
          refs.toggle,
          h('span', { class: 'task-id' }, inst.task_id),
          h('span', { class: 'iid mono', title: inst.id }, shortId(inst.id)),
          refs.badge, refs.attempt, refs.worker, refs.dur);
      }
      if (refs.depth !== depth) {
        refs.depth = depth;
        refs.el.style.paddingLeft = `${6 + depth * 20}px`;
      }
      if (refs.kind !== kind) {
        refs.kind = kind;
        refs.toggle.className = `tree-toggle${kind === 'leaf' ? ' leaf' : ''}`;
        refs.toggle.textContent = kind === 'closed' ? '▸' : '▾';
        refs.toggle.setAttribute('aria-label', kind === 'open' ? 'collapse' : 'expand');
        refs.toggle.tabIndex = kind === 'leaf' ? -1 : 0;
      }
      this.patchLine(refs, inst);
      return refs;
    }

    patchLine(refs, inst) {
      if (!inst) return;
      refs.inst = inst;
      if (refs.el.getAttribute('data-state') !== inst.state) refs.el.setAttribute('data-state', inst.state);
      setBadge(refs.badge, inst.state);
      const checks = inst.validation || [];
      const passed = checks.filter((c) => c.passed).length;
      setText(refs.attempt, `attempt ${inst.attempt ?? '—'}${checks.length ? ` · checks ${passed}/${checks.length}` : ''}`);
      setText(refs.worker, inst.worker || '');
      setText(refs.dur, fmtDuration(span(inst.started_ms, inst.ended_ms)));
      const title = [inst.error || '', ...checks.filter((c) => !c.passed)
        .map((c) => `check ${c.name} (${c.level}) failed: ${c.output}`)].filter(Boolean).join('\n');
      if (refs.el.title !== title) refs.el.title = title;
    }

    /** Running durations advance every second. */
    tick() {
      for (const refs of this.lines.values()) {
        const inst = refs.inst;
        if (inst.started_ms != null && inst.ended_ms == null) setText(refs.dur, fmtDuration(span(inst.started_ms, null)));
      }
    }
  }

  function countStates(list) {
    const counts = {};
    for (const inst of list) counts[inst.state] = (counts[inst.state] || 0) + 1;
    return TASK_STATES.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`).join(', ');
  }

  /**
   * The event log. Holds a window of at most EVENT_CAP rows. In live mode new events are appended
   * and the oldest rows dropped; "load older" pages backwards with `from`, and once that pushes the
   * window past the cap the newest rows are dropped and live events are only counted until the user
   * returns to the latest ones.
   */
  class EventLog {
    constructor(view) {
      this.view = view;
      this.mode = 'live';
      this.firstSeq = null;       // oldest shown event
      this.lastSeq = 0;           // newest shown (or, in history mode, newest known) event
      this.latestSeq = 0;         // newest event known from any source
      this.hiddenNewer = 0;
      this.queue = [];            // live items waiting for the next frame
      this.loading = false;
      this.target = 0;            // catch up to this sequence once loading is done
      this.pendingLive = [];      // live batches received while loading

      this.olderText = h('span');
      this.olderBtn = h('button', { type: 'button', id: 'events-load-older', onclick: () => this.loadOlder() }, 'load older');
      this.older = h('div', { class: 'event-older', hidden: true }, this.olderText, this.olderBtn);
      this.list = h('div', { class: 'event-list', id: 'event-list' });
      this.newerText = h('span');
      this.newer = h('div', { class: 'event-newer', hidden: true }, this.newerText,
        h('button', { type: 'button', id: 'events-latest', onclick: () => this.showLatest() }, 'show latest'));
      this.info = h('span', { class: 'sub' });
      this.list.append(this.older);
      // "Failures only": rows of the bad kinds (failed, lost, timed out, budget exhausted).
      this.failuresOnly = h('input', { type: 'checkbox', id: 'events-failures-only' });
      this.failuresOnly.addEventListener('change', () => this.list.classList.toggle('failures-only', this.failuresOnly.checked));
      this.el = h('section', { class: 'card', id: 'event-log' },
        h('div', { class: 'card-head' }, h('h3', null, 'Event log'), this.info, h('div', { class: 'grow' }),
          h('label', { class: 'sub' }, this.failuresOnly, ' failures only')),
        this.list, this.newer);
      this.list.addEventListener('click', (ev) => {
        const row = ev.target.closest('.event[data-row-instance]');
        if (row) this.view.drawer.open(row.getAttribute('data-row-instance'));
      });
    }

    base() {
      return `/api/executions/${enc(this.view.id)}/events`;
    }

    rowCount() {
      return this.list.childElementCount - 1; // minus the "older" bar
    }

    /**
     * The task an event is about, by its task id; an instance the page does not know yet shows
     * its short id until `relabel` names it.
     */
    instCell(instance) {
      if (!instance) return h('span', { class: 'inst' });
      const inst = this.view.instances.get(instance);
      if (inst && inst.task_id) return h('span', { class: 'inst', title: `instance ${instance}` }, inst.task_id);
      return h('span', { class: 'inst', title: `instance ${instance}`, 'data-instance': instance }, shortId(instance));
    }

    /** Names the rows whose instance has become known since they were made. */
    relabel() {
      for (const el of this.list.querySelectorAll('.inst[data-instance]')) {
        const inst = this.view.instances.get(el.dataset.instance);
        if (!inst || !inst.task_id) continue;
        setText(el, inst.task_id);
        delete el.dataset.instance;
      }
    }

    makeRow(ev) {
      // An execution that finished other than completed is a failure to find, not a success.
      const cat = ev.kind === 'execution_finished' && ev.detail !== 'completed' ? 'bad' : EVENT_CATEGORY[ev.kind];
      const row = h('div', { class: ev.seq % 2 ? 'event odd' : 'event', 'data-seq': ev.seq, 'data-kind': ev.kind, 'data-cat': cat || null, 'data-row-instance': ev.instance || null },
        h('span', { class: 'ts', title: ev.ts_ms ? new Date(ev.ts_ms).toLocaleString() : '' }, ev.ts_ms ? fmtClock(ev.ts_ms, true) : ''),
        h('span', { class: 'seq' }, `#${ev.seq}`),
        h('span', { class: 'kind', title: ev.kind }, ev.kind),
        this.instCell(ev.instance),
        h('span', { class: 'detail' }, (ev.attempt != null && ev.attempt > 1 ? `[attempt ${ev.attempt}] ` : '') + (ev.detail || '')));
      return row;
    }

    /** First load of the stored log, as the page opens. */
    async loadInitial() {
      this.loading = true;
      try {
        const data = await api(`${this.base()}?from=1&limit=${EVENT_PAGE}`, { signal: this.view.ctl.signal });
        banner.clear('events');
        const events = data.events || [];
        this.queue.push({ events, omitted: 0 });
        if (events.length) this.lastSeq = events[events.length - 1].seq;
        this.noteLatest(this.lastSeq);
        // when `next` is set there is more: the snapshot's sequence tells how far to catch up
      } catch (err) {
        report('events', err);
      } finally {
        this.loading = false;
      }
      await this.catchUp();
    }

    noteLatest(seq) {
      if (seq > this.latestSeq) this.latestSeq = seq;
    }

    /** Brings the window up to `target` (the snapshot's sequence), then replays buffered live events. */
    async catchUp(target) {
      if (target != null) this.target = Math.max(this.target, target);
      if (this.loading || this.mode !== 'live') return;
      this.loading = true;
      try {
        let guard = 0;
        while (this.lastSeq < this.target && guard < 4 && this.view.alive) {
          guard += 1;
          let from = this.lastSeq + 1;
          if (this.target - this.lastSeq > EVENT_CAP) {
            // too far behind to be worth paging through: restart the window at the tail
            from = Math.max(1, this.target - EVENT_PAGE + 1);
            this.queue.push({ reset: true });
          }
          const data = await api(`${this.base()}?from=${from}&limit=${EVENT_PAGE}`, { signal: this.view.ctl.signal });
          const events = (data.events || []).filter((e) => e.seq >= from);
          if (!events.length) break;
          this.queue.push({ events, omitted: 0 });
          this.lastSeq = events[events.length - 1].seq;
          this.noteLatest(this.lastSeq);
          if (data.next == null) break;
        }
      } catch (err) {
        report('events', err);
      } finally {
        this.loading = false;
      }
      const pending = this.pendingLive;
      this.pendingLive = [];
      for (const batch of pending) this.pushLive(batch.events, batch.omitted);
      this.view.schedule();
    }

    /** Events from an `update` message. */
    pushLive(events, omitted) {
      const list = events || [];
      if (list.length) this.noteLatest(list[list.length - 1].seq);
      if (this.loading) {
        this.pendingLive.push({ events: list, omitted });
        if (this.pendingLive.length > 200) this.pendingLive.shift();
        return;
      }
      if (this.mode === 'history') {
        this.hiddenNewer += list.length + (omitted || 0);
        this.view.schedule();
        return;
      }
      const fresh = list.filter((e) => e.seq > this.lastSeq);
      if (!fresh.length && !omitted) return;
      if (fresh.length) this.lastSeq = fresh[fresh.length - 1].seq;
      this.queue.push({ events: fresh, omitted: omitted || 0 });
      // a hidden tab gets no frames: keep the backlog bounded
      let queued = 0;
      for (const item of this.queue) queued += item.events ? item.events.length : 0;
      while (queued > EVENT_CAP && this.queue.length > 1) {
        const dropped = this.queue.shift();
        queued -= dropped.events ? dropped.events.length : 0;
      }
      this.view.schedule();
    }

    /** Renders queued items; called from the frame callback. */
    flush() {
      if (this.queue.length) {
        const atBottom = this.list.scrollTop + this.list.clientHeight >= this.list.scrollHeight - 12;
        const frag = document.createDocumentFragment();
        for (const item of this.queue) {
          if (item.reset) {
            while (this.list.lastChild !== this.older) this.list.lastChild.remove();
            this.firstSeq = null;
            continue;
          }
          if (item.omitted > 0) {
            frag.append(h('div', { class: 'event-omitted' }, `… ${item.omitted} event${item.omitted === 1 ? '' : 's'} not shown`));
          }
          for (const ev of item.events) {
            if (this.firstSeq == null) this.firstSeq = ev.seq;
            frag.append(this.makeRow(ev));
          }
          // appended item by item, so that a later reset item also clears these rows
          this.list.append(frag);
        }
        this.queue = [];
        this.trimOldest();
        if (atBottom) this.list.scrollTop = this.list.scrollHeight;
      }
      this.updateBars();
    }

    trimOldest() {
      let excess = this.rowCount() - EVENT_CAP;
      while (excess > 0) {
        const first = this.older.nextSibling;
        if (!first) break;
        first.remove();
        excess -= 1;
      }
      // the oldest row may be an "omitted" line: look a few rows further for an event
      let el = this.older.nextElementSibling;
      while (el && !el.classList.contains('event')) el = el.nextElementSibling;
      this.firstSeq = el ? Number(el.getAttribute('data-seq')) : null;
    }

    updateBars() {
      const older = this.firstSeq != null ? this.firstSeq - 1 : 0;
      this.older.hidden = older <= 0;
      setText(this.olderText, `${older} older event${older === 1 ? '' : 's'} not shown`);
      this.newer.hidden = this.mode !== 'history';
      setText(this.newerText, `${this.hiddenNewer} newer event${this.hiddenNewer === 1 ? '' : 's'} not shown`);
      setText(this.info, `${this.rowCount()} rows${this.latestSeq ? ` · latest #${this.latestSeq}` : ''}`);
    }

    /** Prepends the page before the oldest shown event. */
    async loadOlder() {
      if (this.firstSeq == null || this.firstSeq <= 1 || this.olderBtn.disabled) return;
      const before = this.firstSeq;
      const from = Math.max(1, before - EVENT_PAGE);
      this.olderBtn.disabled = true;
      try {
        const data = await api(`${this.base()}?from=${from}&limit=${before - from}`, { signal: this.view.ctl.signal });
        const events = (data.events || []).filter((e) => e.seq < before);
        if (!events.length) return;
        // keep the rows the user was looking at in place (measured, as the browser's own scroll
        // anchoring applies only when the list is not scrolled to the very top)
        const anchor = this.older.nextElementSibling;
        const anchorTop = anchor ? anchor.getBoundingClientRect().top : 0;
        const frag = document.createDocumentFragment();
        for (const ev of events) frag.append(this.makeRow(ev));
        this.older.after(frag);
        this.firstSeq = events[0].seq;
        if (anchor) this.list.scrollTop += anchor.getBoundingClientRect().top - anchorTop;
        let excess = this.rowCount() - EVENT_CAP;
        if (excess > 0) {
          // the window moves back in time: drop the newest rows and stop following the stream
          let dropped = 0;
          while (excess > 0 && this.list.lastChild !== this.older) {
            const last = this.list.lastChild;
            if (last.classList.contains('event')) dropped += 1;
            last.remove();
            excess -= 1;
          }
          if (this.mode === 'live') {
            this.mode = 'history';
            this.hiddenNewer = 0;
          }
          this.hiddenNewer += dropped;
          const lastRow = this.list.lastElementChild;
          this.lastSeq = lastRow && lastRow.classList.contains('event') ? Number(lastRow.getAttribute('data-seq')) : this.lastSeq;
        }
        this.updateBars();
      } catch (err) {
        report('events', err);
      } finally {
        this.olderBtn.disabled = false;
      }
    }

    /** Leaves history mode: reloads the newest events and follows the stream again. */
    showLatest() {
      this.mode = 'live';
      this.hiddenNewer = 0;
      this.queue = [{ reset: true }];
      this.lastSeq = Math.max(0, this.latestSeq - EVENT_PAGE);
      this.catchUp(this.latestSeq).then(() => {
        this.list.scrollTop = this.list.scrollHeight;
      });
      this.view.schedule();
    }
  }

  /** Checkpoints table, refreshed every 10 s and after a checkpoint control. */
  class Checkpoints {
    constructor(view) {
      this.view = view;
      this.tbody = h('tbody');
      this.empty = h('div', { class: 'empty' }, 'Loading…');
      this.info = h('span', { class: 'sub' });
      this.el = h('section', { class: 'card', id: 'checkpoints' },
        h('div', { class: 'card-head' }, h('h3', null, 'Checkpoints'), this.info),
        h('table', { class: 'grid' },
          h('thead', null, h('tr', null,
            h('th', null, 'Id'), h('th', { class: 'right' }, 'Sequence'), h('th', null, 'Kind'),
            h('th', null, 'Created'), h('th', { class: 'right' }, 'Size'), h('th', null, 'SHA-256'))),
          this.tbody),
        this.empty);
    }

    async refresh() {
      try {
        const data = await api(`/api/executions/${enc(this.view.id)}/checkpoints`, { signal: this.view.ctl.signal });
        banner.clear('checkpoints');
        const list = data.checkpoints || [];
        this.tbody.replaceChildren(...list.map((c) => h('tr', { 'data-checkpoint-id': c.id },
          h('td', { class: 'mono', title: c.id }, shortId(c.id)),
          h('td', { class: 'right num' }, c.sequence),
          h('td', null, c.kind),
          h('td', { class: 'num' }, fmtDateTime(c.created_at_ms)),
          h('td', { class: 'right num' }, fmtBytes(c.size_bytes)),
          h('td', { class: 'mono muted', title: c.sha256 || '' }, c.sha256 ? `${String(c.sha256).slice(0, 16)}…` : '—'))));
        this.empty.hidden = list.length > 0;
        setText(this.empty, 'No checkpoints yet.');
        setText(this.info, list.length ? `${list.length}` : '');
      } catch (err) {
        report('checkpoints', err);
        if (!isAbort(err)) setText(this.empty, `Checkpoints unavailable: ${err.message}`);
      }
    }
  }

  /** Most task log lines kept on the page; older ones leave it first. */
  const MAX_LOG_LINES = 5000;

  /**
   * Task log lines (`ctx.log`, a shell command's stdout and stderr), of every task or one,
   * streamed live (`/logs/live`, Server-Sent Events) as workers publish them. The stream ends by
   * itself once the execution has ended and its last lines arrived; after a break the page
   * reconnects from the lines it has, so none comes twice.
   */
  class TaskLogs {
    constructor(view) {
      this.view = view;
      this.next = 0;
      this.instance = '';
      this.es = null;
      this.retry = 0;
      this.done = false;
      this.known = -1;
      this.select = h('select', { 'aria-label': 'Task', class: 'log-task' },
        h('option', { value: '' }, 'All tasks'));
      this.select.addEventListener('change', () => {
        this.instance = this.select.value;
        this.next = 0;
        this.done = false;
        this.body.replaceChildren();
        this.open();
      });
      this.body = h('div', { class: 'log-lines mono' });
      this.empty = h('div', { class: 'empty' }, 'No log lines yet.');
      this.info = h('span', { class: 'sub grow' });
      this.el = h('section', { class: 'card', id: 'task-logs' },
        h('div', { class: 'card-head' }, h('h3', null, 'Task logs'), this.info, this.select),
        this.body, this.empty);
    }

    /** Offers each instance of the execution, by task and attempt. */
    updateTasks() {
      const instances = [...this.view.instances.values()].filter((i) => i.attempt > 0);
      if (instances.length === this.known) return;
      this.known = instances.length;
      this.select.replaceChildren(h('option', { value: '' }, 'All tasks'),
        ...instances.map((i) => h('option', { value: i.id }, `${i.task_id} · ${shortId(i.id)}`)));
      this.select.value = this.instance;
    }

    label(line) {
      const inst = this.view.instances.get(line.instance);
      return `${inst ? inst.task_id : shortId(line.instance)}#${line.attempt}`;
    }

    /** Called every second: keeps the task list current and the stream open while lines may come. */
    ensure() {
      this.updateTasks();
      // Nothing to read before the execution is known (an unknown id never is).
      if (!this.es && !this.retry && !this.done && this.view.execution) this.open();
    }

    /** (Re)opens the stream after the lines the page already has. */
    open() {
      this.close();
      if (!this.view.alive) return;
      const query = new URLSearchParams({ after: String(this.next) });
      if (this.instance) query.set('instance', this.instance);
      // EventSource cannot send headers: a token goes in the address.
      const t = token.get();
      if (t) query.set('access_token', t);
      const es = new EventSource(`/api/executions/${enc(this.view.id)}/logs/live?${query}`);
      this.es = es;
      const handle = (fn) => (msg) => {
        if (this.es !== es) return;
        let data;
        try { data = JSON.parse(msg.data); } catch (_) {
          banner.set('logs', 'unreadable message on the task log stream');
          return;
        }
        fn(data);
      };
      es.addEventListener('lines', handle((d) => {
        banner.clear('logs');
        this.append(d.lines || [], Number(d.next));
      }));
      es.addEventListener('end', handle(() => {
        this.done = true;
        this.close();
      }));
      es.addEventListener('failed', handle((d) => {
        banner.set('logs', `Task logs: ${d.error}`);
        this.reconnectLater();
      }));
      // EventSource would reconnect from the first address; reconnect from `next` instead.
      es.addEventListener('error', () => { if (this.es === es) this.reconnectLater(); });
    }

    reconnectLater() {
      this.close();
      this.retry = setTimeout(() => {
        this.retry = 0;
        if (!this.done) this.open();
      }, 3000);
    }

    close() {
      if (this.es) {
        this.es.close();
        this.es = null;
      }
      clearTimeout(this.retry);
      this.retry = 0;
    }

    /** Follows the log again after the execution left a terminal state (retry). */
    revive() {
      this.done = false;
      this.ensure();
    }

    append(lines, next) {
      const body = this.body;
      const stick = body.scrollTop + body.clientHeight >= body.scrollHeight - 4;
      body.append(...lines.map((line) => h('div', { class: `log-line src-${line.source}`, title: line.worker ? `on ${line.worker}` : null },
        h('span', { class: 'muted' }, fmtClock(line.at_ms, true)), ' ',
        h('span', { class: 'who' }, this.label(line)), ' ',
        h('span', { class: 'text' }, line.text + (line.cut_from_bytes ? ` … [cut from ${line.cut_from_bytes} bytes]` : '')))));
      while (body.childElementCount > MAX_LOG_LINES) body.firstElementChild.remove();
      this.next = next || this.next + lines.length;
      if (stick) body.scrollTop = body.scrollHeight;
      this.empty.hidden = this.next > 0;
      setText(this.info, this.next ? `${this.next} lines` : '');
    }
  }

  /**
   * The task drawer: one instance in full — its input and output, every attempt with its error,
   * worker and times, its validation results, its open question and its log lines (read again
   * every second while it runs). Opened from a DAG node, a tree line, a timeline bar or an event
   * row; Escape or × closes it.
   */
  class TaskDrawer {
    constructor(view) {
      this.view = view;
      this.instance = null;
      this.timer = null;
      this.logNext = 0;
      this.title = h('h3', { id: 'drawer-title' });
      this.body = h('div', { class: 'drawer-body' });
      this.logs = h('div', { class: 'log-lines mono', id: 'drawer-logs' });
      const close = h('button', { type: 'button', class: 'drawer-close', title: 'close (Esc)', 'aria-label': 'close', onclick: () => this.close() }, '×');
      this.el = h('aside', { class: 'drawer', id: 'task-drawer', hidden: true, role: 'dialog', 'aria-labelledby': 'drawer-title' },
        h('div', { class: 'drawer-head' }, this.title, close), this.body);
      this.onKey = (ev) => { if (ev.key === 'Escape' && !this.el.hidden) this.close(); };
      document.addEventListener('keydown', this.onKey);
    }

    destroy() {
      this.close();
      document.removeEventListener('keydown', this.onKey);
    }

    close() {
      this.el.hidden = true;
      this.instance = null;
      clearTimeout(this.timer);
      this.timer = null;
    }

    /** A plan task that has no instance yet. */
    notStarted(taskId) {
      this.close();
      setText(this.title, taskId);
      this.body.replaceChildren(h('p', { class: 'empty' }, 'Not started yet: it waits for its dependencies.'));
      this.el.hidden = false;
    }

    async open(instanceId) {
      if (!instanceId) return;
      this.close();
      this.instance = instanceId;
      this.logNext = 0;
      this.logs.replaceChildren();
      const known = this.view.instances.get(instanceId);
      setText(this.title, known ? known.task_id : shortId(instanceId));
      this.body.replaceChildren(h('p', { class: 'empty' }, 'Loading…'));
      this.el.hidden = false;
      await this.refresh();
    }

    async refresh() {
      const id = this.instance;
      if (!id || !this.view.alive) return;
      let detail;
      try {
        detail = await api(`/api/executions/${enc(this.view.id)}/instances/${enc(id)}`, { signal: this.view.ctl.signal });
      } catch (err) {
        if (isAbort(err) || this.instance !== id) return;
        this.body.replaceChildren(h('p', { class: 'err' }, `This task could not be read: ${err.message}`));
        return;
      }
      if (this.instance !== id) return;
      this.render(detail);
      await this.readLogs(id);
      if (this.instance === id && !TERMINAL_TASK.has(detail.state)) {
        this.timer = setTimeout(() => this.refresh(), 1000);
      }
    }

    render(d) {
      setText(this.title, d.task_id);
      const times = (a) => [
        a.dispatched_ms != null ? `dispatched ${fmtClock(a.dispatched_ms, true)}` : null,
        a.started_ms != null ? `started ${fmtClock(a.started_ms, true)}` : null,
        a.ended_ms != null ? `finished ${fmtClock(a.ended_ms, true)}` : null,
      ].filter(Boolean).join(' · ');
      const waited = d.dispatched_ms != null && d.started_ms != null ? `waited ${fmtDuration(d.started_ms - d.dispatched_ms)} in the queue` : null;
      const ran = d.started_ms != null ? `ran ${fmtDuration((d.ended_ms ?? Date.now()) - d.started_ms)}` : null;
      const attempts = [
        ...(d.earlier_attempts || []).map((a) => h('li', { class: 'attempt' },
          h('b', null, `attempt ${a.attempt}`), ` on ${a.worker_id || '—'} · `,
          [a.dispatched_at_ms != null ? `dispatched ${fmtClock(a.dispatched_at_ms, true)}` : null,
            a.started_at_ms != null ? `started ${fmtClock(a.started_at_ms, true)}` : null,
            a.ended_at_ms != null ? `finished ${fmtClock(a.ended_at_ms, true)}` : null].filter(Boolean).join(' · '),
          a.error ? h('div', { class: 'err' }, a.error) : null)),
        h('li', { class: 'attempt current' },
          h('b', null, `attempt ${d.attempt}`), ` on ${d.worker || '—'} · `, times(d),
          d.error ? h('div', { class: 'err' }, d.error) : null),
      ];
      const question = (this.view.openQuestions || []).find((q) => q.task_instance_id === d.id);
      const output = d.output_ref
        ? h('p', null, `Stored by reference: ${fmtBytes(d.output_ref.size)} in ${d.output_ref.object} (sha256 ${String(d.output_ref.sha256).slice(0, 12)}…). Fetch it with `,
          h('code', null, `trellis output ${this.view.id} ${d.task_id}`), '.')
        : jsonBlock(d.output, 'drawer-output');
      this.body.replaceChildren(...[
        h('div', { class: 'drawer-meta' }, badge(d.state),
          h('span', { class: 'mono muted', title: 'instance id' }, d.id),
          h('div', null, [`created ${fmtClock(d.created_ms, true)}`, waited, ran].filter(Boolean).join(' · '))),
        h('h4', null, 'Input'), jsonBlock(d.input, 'drawer-input'),
        h('h4', null, 'Output'), output,
        h('h4', null, 'Attempts'), h('ol', { class: 'attempts', id: 'drawer-attempts' }, attempts),
        (d.validation || []).length ? h('h4', null, 'Validation') : null,
        (d.validation || []).length ? h('ul', { class: 'checks' }, d.validation.map((c) => h('li', { class: c.passed ? 'ok' : 'err' },
          `${c.passed ? '✓' : '✗'} ${c.name} (${c.level}, ${fmtDuration(c.duration_ms)})`, c.output ? h('pre', null, c.output) : null))) : null,
        question ? h('h4', null, 'Question') : null,
        question ? h('p', null, question.text, (question.options || []).length ? h('span', { class: 'muted' }, ` — ${question.options.join(' / ')}`) : null) : null,
        h('h4', null, 'Log'), this.logs,
      ].filter(Boolean));
    }

    async readLogs(id) {
      try {
        const data = await api(`/api/executions/${enc(this.view.id)}/logs?instance=${enc(id)}&after=${this.logNext}`, { signal: this.view.ctl.signal });
        if (this.instance !== id) return;
        const lines = data.lines || [];
        this.logs.append(...lines.map((line) => h('div', { class: `log-line src-${line.source}` },
          h('span', { class: 'muted' }, fmtClock(line.at_ms, true)), ' ',
          h('span', { class: 'who' }, `#${line.attempt}`), ' ',
          h('span', { class: 'text' }, line.text))));
        this.logNext = Number(data.next) || this.logNext + lines.length;
        if (!this.logNext) this.logs.replaceChildren(h('div', { class: 'empty' }, 'No log lines.'));
        else this.logs.querySelector(':scope > .empty')?.remove();
      } catch (err) {
        if (!isAbort(err)) this.logs.replaceChildren(h('div', { class: 'err' }, `Log unavailable: ${err.message}`));
      }
    }
  }

  /** A JSON value, pretty and folded past 40 lines; `—` for none. */
  function jsonBlock(value, id) {
    if (value === undefined || value === null) return h('p', { class: 'muted', id }, '—');
    const text = JSON.stringify(value, null, 2);
    const pre = h('pre', { class: 'json', id }, text);
    if (text.split('\n').length <= 40) return pre;
    return h('details', null, h('summary', null, `${text.split('\n').length} lines`), pre);
  }

  // ------------------------------------------------------------------------------------------
  // execution page: data and wiring
  // ------------------------------------------------------------------------------------------

  class ExecutionView {
    constructor(root, id) {
      this.root = root;
      this.id = id;
      this.ctl = new AbortController();
      this.alive = true;
      this.execution = null;
      this.plan = null;              // {tasks, columns: [[id]], conflicts}
      this.instances = new Map();    // id -> Instance (plus _order, _seq)
      this.nextOrder = 0;
      this.snapshotSeq = -1;
      this.finished = false;
      this.es = null;
      this.timers = [];

      // plan task id -> wave index; newest instance and state per plan task; counts per wave
      this.planWave = new Map();
      this.newestByTask = new Map();
      this.taskState = new Map();
      this.waveCounts = [];

      // pending render work
      this.changed = new Set();
      this.dirtyTasks = new Set();
      this.dirtyWaves = new Set();
      this.dirtyHeader = false;
      this.rafId = 0;
      this.laterTimer = null;

      this.refetchDetail = throttle(() => this.loadDetail(), 300);
      this.refetchInstances = throttle(() => this.loadInstances(), 2000);
    }

    mount() {
      this.header = new ExecHeader(this);
      this.questions = new Questions(this);
      this.dag = new DagView(this);
      this.timeline = new Timeline(this);
      this.tree = new TreeView(this);
      this.events = new EventLog(this);
      this.checkpoints = new Checkpoints(this);
      this.logs = new TaskLogs(this);
      this.drawer = new TaskDrawer(this);
      const legend = h('div', { class: 'legend', id: 'legend' },
        TASK_STATES.map((s) => h('span', { 'data-state': s }, h('span', { class: 'swatch' }), stateLabel(s))));
      this.root.replaceChildren(h('div', { class: 'exec-page' },
        this.header.el, this.questions.el, legend, this.dag.el, this.timeline.el,
        h('div', { class: 'split' }, this.tree.el, this.events.el),
        this.logs.el, this.checkpoints.el), this.drawer.el);
      this.header.controls.update();

      this.loadDetail();
      this.loadPlan();
      this.events.loadInitial();
      poll(() => this.checkpoints.refresh(), 10000, this.ctl.signal);
      poll(() => this.logs.ensure(), 1000, this.ctl.signal);
      this.openLive();
      this.timers.push(setInterval(() => this.tick(), 1000));
      this.schedule();
    }

    unmount() {
      this.alive = false;
      this.ctl.abort();
      this.closeLive();
      this.logs.close();
      this.drawer.destroy();
      this.timers.forEach(clearInterval);
      this.refetchDetail.cancel();
      this.refetchInstances.cancel();
      clearTimeout(this.laterTimer);
      if (this.rafId) cancelAnimationFrame(this.rafId);
      this.timeline.destroy();
    }

    onConfig() {
      this.header.controls.clearError();
      this.header.controls.update();
      this.questions.updateAccess();
    }

    // ---- loading ------------------------------------------------------------------------------

    async loadDetail() {
      if (!this.alive) return;
      try {
        const data = await api(`/api/executions/${enc(this.id)}`, { signal: this.ctl.signal });
        banner.clear('execution');
        if (data.execution) this.setExecution(data.execution);
        this.openQuestions = Array.isArray(data.questions) ? data.questions : [];
        this.questions.render(this.openQuestions);
        this.renderHolds(Array.isArray(data.holds) ? data.holds : []);
        // a retried or resumed execution runs again: follow it
        if (data.execution && !TERMINAL_EXEC.has(data.execution.state) && this.finished) this.reviveLive();
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) {
          this.showNotFound(err.message);
          return;
        }
        report('execution', err);
      }
    }

    /**
     * The execution does not exist (or the token may not see it): one page that says so, with
     * the way back, instead of empty panes under a "pending" badge and the same error twice.
     */
    showNotFound(message) {
      this.finished = true;
      this.unmount();
      for (const key of ['execution', 'plan', 'events', 'instances', 'checkpoints', 'logs', 'live']) {
        banner.clear(key);
      }
      this.root.replaceChildren(h('section', { class: 'card not-found', id: 'not-found' },
        h('h2', null, 'Execution not found'),
        h('p', { class: 'mono' }, this.id),
        h('p', { class: 'sub' }, message || 'No execution has this id.'),
        h('p', null, h('a', { href: '#/' }, '← All executions'))));
    }

    /** Shows the tasks and groups of this execution paused on their own, with why and how. */
    renderHolds(holds) {
      const el = this.header.f.holds;
      el.hidden = holds.length === 0;
      el.replaceChildren(...holds.map((hold) => h('div', { class: 'hold' },
        `Paused: ${hold.scope} (${hold.mode}) since ${fmtDateTime(hold.since_ms)}${hold.reason ? ` — ${hold.reason}` : ''}`)));
    }

    async loadPlan() {
      try {
        const plan = await api(`/api/executions/${enc(this.id)}/plan`, { signal: this.ctl.signal });
        banner.clear('plan');
        this.setPlan(plan);
      } catch (err) {
        // An unknown execution is shown once, by the detail's not-found page.
        if (err instanceof ApiError && err.status === 404) return;
        report('plan', err);
        if (!isAbort(err)) this.dag.showError(`Plan unavailable: ${err.message}`);
      }
    }

    async loadInstances() {
      if (!this.alive) return;
      try {
        const data = await api(`/api/executions/${enc(this.id)}/instances`, { signal: this.ctl.signal });
        banner.clear('instances');
        const seq = Number(data.seq) || 0;
        for (const inst of data.instances || []) this.applyInstance(inst, seq);
        this.schedule();
      } catch (err) {
        report('instances', err);
      }
    }

    // ---- live stream ---------------------------------------------------------------------------

    openLive() {
      if (this.es || !this.alive) return;
      // EventSource cannot send headers: a token goes in the address, which the monitor accepts
      // for this stream only.
      const t = token.get();
      const auth = t ? `?access_token=${encodeURIComponent(t)}` : '';
      const es = new EventSource(`/api/executions/${enc(this.id)}/live${auth}`);
      this.es = es;
      this.header.setLive('connecting');
      const handle = (fn) => (msg) => {
        if (this.es !== es) return;
        let data;
        try { data = JSON.parse(msg.data); } catch (_) {
          banner.set('live', 'unreadable message on the live stream');
          return;
        }
        fn(data);
      };
      es.addEventListener('snapshot', handle((d) => this.onSnapshot(d)));
      es.addEventListener('update', handle((d) => this.onUpdate(d)));
      es.addEventListener('end', () => { if (this.es === es) this.onEnd(); });
      es.addEventListener('open', () => {
        if (this.es !== es) return;
        banner.clear('net');
        this.header.setLive('live');
      });
      es.addEventListener('error', () => {
        if (this.es !== es) return;
        if (es.readyState === EventSource.CLOSED) {
          // refused outright (EventSource gives up on HTTP errors): try again ourselves
          this.closeLive();
          this.header.setLive('reconnecting');
          setTimeout(() => { if (!this.finished) this.openLive(); }, 3000);
        } else {
          this.header.setLive('reconnecting');
          banner.set('net', NET_DOWN);
        }
      });
    }

    closeLive() {
      if (this.es) {
        this.es.close();
        this.es = null;
      }
    }

    /** Follows the execution again after it left a terminal state (retry). */
    reviveLive() {
      this.finished = false;
      this.closeLive();
      this.openLive();
      this.logs.revive();
    }

    onSnapshot(d) {
      this.snapshotSeq = Number(d.seq) || 0;
      banner.clear('net');
      this.header.setLive('live');
      if (d.execution) this.setExecution(d.execution);
      const list = Array.isArray(d.instances) ? d.instances : [];
      // `?records=0` snapshots carry no instances; keep what we have then
      if (list.length || this.instances.size === 0) {
        this.instances = new Map();
        this.nextOrder = 0;
        for (const inst of list) {
          inst._order = this.nextOrder++;
          inst._seq = this.snapshotSeq;
          this.instances.set(inst.id, inst);
        }
        this.recomputePlanStates();
        this.structureChanged();
      }
      this.events.noteLatest(this.snapshotSeq);
      this.events.catchUp(this.snapshotSeq);
      this.schedule();
    }

    onUpdate(d) {
      const seq = Number(d.seq) || 0;
      if (seq <= this.snapshotSeq) return; // already part of the snapshot
      if (d.execution) this.setExecution(d.execution);
      for (const inst of d.instances || []) this.applyInstance(inst, seq);
      const events = Array.isArray(d.events) ? d.events : [];
      this.events.pushLive(events, Number(d.events_omitted) || 0);
      if (events.some((e) => REFETCH_KINDS.has(e.kind))) this.refetchDetail();
      if (Number(d.instances_omitted) > 0) this.refetchInstances();
      this.schedule();
    }

    onEnd() {
      this.finished = true;
      this.closeLive();
      this.header.setLive('finished');
      this.refetchDetail();
      this.timeline.layoutDirty = true;
      this.schedule();
    }

    // ---- model ---------------------------------------------------------------------------------

    setExecution(exec) {
      this.execution = exec;
      this.dirtyHeader = true;
      this.schedule();
    }

    /** Merges one instance. Answers older than what we already hold (`_seq`) are ignored. */
    applyInstance(inst, seq) {
      const prev = this.instances.get(inst.id);
      if (prev && prev._seq > seq) return;
      inst._seq = seq;
      if (prev) inst._order = prev._order;
      else {
        inst._order = this.nextOrder++;
        this.structureChanged();
      }
      this.instances.set(inst.id, inst);
      this.changed.add(inst.id);
      if (this.timeline.mode === 'worker') this.timeline.layoutDirty = true;
      if (this.planWave.has(inst.task_id)) this.trackPlanTask(inst);
    }

    structureChanged() {
      this.tree.needsBuild = true;
      this.timeline.layoutDirty = true;
    }

    /** A plan task shows the state of its newest instance (latest creation, then latest arrival). */
    trackPlanTask(inst) {
      const id = inst.task_id;
      const cur = this.newestByTask.get(id);
      if (cur && cur.id !== inst.id && byCreated(inst, cur) < 0) return;
      this.newestByTask.set(id, inst);
      this.setTaskState(id, inst.state);
      this.dirtyTasks.add(id); // the tooltip shows instance details even without a state change
    }

    setTaskState(id, state) {
      const old = this.taskState.get(id) || 'pending';
      if (old === state) return;
      this.taskState.set(id, state);
      const wave = this.planWave.get(id);
      const counts = this.waveCounts[wave];
      if (counts) {
        counts[old] = (counts[old] || 0) - 1;
        counts[state] = (counts[state] || 0) + 1;
        this.dirtyWaves.add(wave);
      }
      this.dirtyTasks.add(id);
    }

    /** Full pass after a snapshot or once the plan arrives. */
    recomputePlanStates() {
      const newest = new Map();
      for (const inst of this.instances.values()) {
        if (!this.planWave.has(inst.task_id)) continue;
        const cur = newest.get(inst.task_id);
        if (!cur || byCreated(inst, cur) >= 0) newest.set(inst.task_id, inst);
      }
      this.newestByTask = newest;
      const previous = this.taskState;
      this.taskState = new Map();
      this.waveCounts = (this.plan ? this.plan.columns : []).map(() => ({}));
      for (const [id, wave] of this.planWave) {
        const inst = newest.get(id);
        const state = inst ? inst.state : 'pending';
        this.taskState.set(id, state);
        const counts = this.waveCounts[wave];
        counts[state] = (counts[state] || 0) + 1;
        if ((previous.get(id) || 'pending') !== state || inst) this.dirtyTasks.add(id);
      }
      this.waveCounts.forEach((_, i) => this.dirtyWaves.add(i));
    }

    setPlan(raw) {
      const tasks = Array.isArray(raw.tasks) ? raw.tasks : [];
      const known = new Set(tasks.map((t) => t.id));
      let columns = Array.isArray(raw.waves) && raw.waves.length ? raw.waves.map((w) => w.filter((id) => known.has(id))) : null;
      if (!columns) {
        // no wave lists: group by each task's `wave`
        const byWave = new Map();
        for (const t of tasks) {
          const w = Number(t.wave) || 0;
          if (!byWave.has(w)) byWave.set(w, []);
          byWave.get(w).push(t.id);
        }
        columns = [...byWave.keys()].sort((a, b) => a - b).map((w) => byWave.get(w));
      }
      // tasks missing from the wave lists go to a last column rather than vanish
      const placed = new Set(columns.flat());
      const stray = tasks.filter((t) => !placed.has(t.id)).map((t) => t.id);
      if (stray.length) columns.push(stray);
      this.plan = { name: raw.name, tasks, columns, conflicts: raw.conflicts || [] };
      this.planWave = new Map();
      columns.forEach((ids, w) => ids.forEach((id) => this.planWave.set(id, w)));
      this.recomputePlanStates();
      this.dag.build();
      this.dirtyTasks.clear();
      this.dirtyWaves.clear();
    }

    // ---- rendering -----------------------------------------------------------------------------

    /** Requests one render on the next animation frame. */
    schedule() {
      if (this.rafId || !this.alive) return;
      this.rafId = requestAnimationFrame(() => this.frame());
    }

    /** Requests a render after `ms` (for throttled work left pending). */
    scheduleLater(ms) {
      if (this.laterTimer) return;
      this.laterTimer = setTimeout(() => {
        this.laterTimer = null;
        this.schedule();
      }, ms);
    }

    frame() {
      this.rafId = 0;
      if (!this.alive) return;
      if (this.dirtyHeader) {
        this.dirtyHeader = false;
        this.header.render();
      }
      if (this.dirtyTasks.size || this.dirtyWaves.size) {
        this.dag.patch(this.dirtyTasks, this.dirtyWaves);
        this.dirtyTasks.clear();
        this.dirtyWaves.clear();
      }
      const changed = this.changed;
      this.changed = new Set();
      this.tree.update(changed);
      this.timeline.draw();
      this.events.flush();
      if (changed.size) this.events.relabel();
    }

    tick() {
      this.header.tick();
      this.tree.tick();
      if (!this.finished) this.schedule(); // bars of running instances grow
    }
  }

  // ------------------------------------------------------------------------------------------
  // router and boot
  // ------------------------------------------------------------------------------------------

  const app = document.getElementById('app');
  let current = null;

  function route() {
    const hash = location.hash.replace(/^#/, '') || '/';
    const m = hash.match(/^\/executions\/([^/?#]+)/);
    if (m) return { name: 'execution', id: decodeURIComponent(m[1]) };
    if (/^\/workers\b/.test(hash)) return { name: 'workers' };
    if (/^\/cluster\b/.test(hash)) return { name: 'cluster' };
    return { name: 'executions' };
  }

  function navigate() {
    if (current) current.unmount();
    banner.reset();
    const r = route();
    for (const a of document.querySelectorAll('[data-nav]')) {
      const nav = r.name === 'workers' || r.name === 'cluster' ? r.name : 'executions';
      a.classList.toggle('active', a.getAttribute('data-nav') === nav);
    }
    if (r.name === 'execution') {
      current = new ExecutionView(app, r.id);
      document.title = 'Execution · Trellis';
    } else if (r.name === 'workers') {
      current = new WorkersView(app);
      document.title = 'Workers · Trellis';
    } else if (r.name === 'cluster') {
      current = new ClusterView(app);
      document.title = 'Cluster · Trellis';
    } else {
      current = new ExecutionsView(app);
      document.title = 'Executions · Trellis';
    }
    current.mount();
    window.scrollTo(0, 0);
  }

  function setupToken() {
    const input = document.getElementById('token-input');
    const status = document.getElementById('token-status');
    const form = document.getElementById('token-form');
    input.value = token.get();
    let timer = null;
    const save = (ev) => {
      if (ev) ev.preventDefault();
      token.set(input.value.trim());
      status.textContent = input.value.trim() ? 'saved' : 'cleared';
      // The page's controls follow the token at once, and its old refusals go.
      if (token.get()) banner.clear('config');
      if (current && current.onConfig) current.onConfig();
      clearTimeout(timer);
      timer = setTimeout(() => { status.textContent = ''; }, 2000);
    };
    form.addEventListener('submit', save);
  }

  async function loadConfig() {
    for (;;) {
      try {
        const data = await api('/api/config');
        config.controls = data.controls !== false;
        config.version = data.version || '';
        config.loaded = true;
        banner.clear('config');
        if (data.token_required && !token.get()) {
          banner.set('config', 'This monitor needs your token: enter it in the token field.');
        }
        document.getElementById('controls-hint').hidden = config.controls;
        document.getElementById('version').textContent = config.version ? `v${config.version}` : '';
        if (current && current.onConfig) current.onConfig();
        return;
      } catch (err) {
        report('config', err);
        await new Promise((resolve) => setTimeout(resolve, 3000));
      }
    }
  }

  /** Keeps the strip of queue, namespace and fleet pauses under the top bar current. */
  async function watchPauses() {
    const el = document.getElementById('pauses');
    for (;;) {
      try {
        const data = await api('/api/pauses');
        const pauses = Array.isArray(data.pauses) ? data.pauses : [];
        el.hidden = pauses.length === 0;
        el.replaceChildren(...pauses.map((p) => h('div', { class: 'pause' },
          `Paused: ${p.target} (${p.mode}) since ${fmtDateTime(p.since_ms)}${p.by ? ` by ${p.by}` : ''}${p.reason ? ` — ${p.reason}` : ''}`)));
      } catch (err) {
        // The banner already reports an unreachable monitor; the strip keeps its last content.
      }
      await new Promise((resolve) => setTimeout(resolve, 5000));
    }
  }

  adoptTokenFromUrl();
  setupToken();
  watchPauses();
  window.addEventListener('hashchange', navigate);
  navigate();
  loadConfig();
})();
