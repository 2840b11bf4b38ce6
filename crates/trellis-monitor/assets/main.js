/**
 * Trellis monitor UI: the router and boot.
 *
 * A hash-routed single page (`#/`, `#/executions/<id>`, `#/plans/<plan name>`, `#/workers`,
 * `#/cluster`, `#/backlog`) talking to the
 * monitor's JSON API and to the per-execution Server-Sent Events stream (see API.md). Plain ES
 * modules, embedded in the monitor binary; no build step.
 */
import { adoptTokenFromUrl, api, banner, config, report, token } from './api.js';
import { BacklogView } from './backlog.js';
import { ClusterView } from './cluster.js';
import { ExecutionView } from './execution.js';
import { ExecutionsView } from './executions.js';
import { PlanHistoryView } from './history.js';
import { fmtDateTime, h } from './util.js';
import { WorkersView } from './workers.js';

const app = document.getElementById('app');
let current = null;

function route() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const m = hash.match(/^\/executions\/([^/?#]+)/);
  if (m) return { name: 'execution', id: decodeURIComponent(m[1]) };
  const p = hash.match(/^\/plans\/([^?#]+)/);
  if (p) {
    try {
      return { name: 'plan', plan: decodeURIComponent(p[1]) };
    } catch (_) {
      return { name: 'plan', plan: p[1] }; // not percent-encoded: as typed
    }
  }
  if (/^\/workers\b/.test(hash)) return { name: 'workers' };
  if (/^\/cluster\b/.test(hash)) return { name: 'cluster' };
  if (/^\/backlog\b/.test(hash)) return { name: 'backlog' };
  return { name: 'executions' };
}

function navigate() {
  if (current) current.unmount();
  banner.reset();
  const r = route();
  for (const a of document.querySelectorAll('[data-nav]')) {
    const nav = ['workers', 'cluster', 'backlog'].includes(r.name) ? r.name : 'executions';
    a.classList.toggle('active', a.getAttribute('data-nav') === nav);
  }
  if (r.name === 'execution') {
    current = new ExecutionView(app, r.id);
    document.title = 'Execution · Trellis';
  } else if (r.name === 'plan') {
    current = new PlanHistoryView(app, r.plan);
    document.title = `${r.plan} · History · Trellis`;
  } else if (r.name === 'workers') {
    current = new WorkersView(app);
    document.title = 'Workers · Trellis';
  } else if (r.name === 'cluster') {
    current = new ClusterView(app);
    document.title = 'Cluster · Trellis';
  } else if (r.name === 'backlog') {
    current = new BacklogView(app);
    document.title = 'Backlog · Trellis';
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

// An error nothing caught stops a part of the page from updating: say so instead of going stale.
window.addEventListener('error', (ev) => {
  banner.set('page', `This page hit an error and may be out of date; reload it. (${ev.message} at ${ev.filename}:${ev.lineno})`);
});
window.addEventListener('unhandledrejection', (ev) => {
  const reason = ev.reason && ev.reason.message ? ev.reason.message : String(ev.reason);
  banner.set('page', `This page hit an error and may be out of date; reload it. (${reason})`);
});

adoptTokenFromUrl();
setupToken();
watchPauses();
window.addEventListener('hashchange', navigate);
navigate();
loadConfig();
