/**
 * Execution page (`#/executions/<id>`): its data and the wiring of its parts. Incoming stream
 * messages only record what changed; one animation frame patches the DOM.
 */
import { api, ApiError, banner, isAbort, poll, report, token } from './api.js';
import { NET_DOWN, REFETCH_KINDS, TASK_STATES, TERMINAL_EXEC } from './const.js';
import { DagView } from './dag.js';
import { TaskDrawer } from './drawer.js';
import { EventLog } from './events.js';
import { ExecHeader, Questions } from './exec-header.js';
import { Checkpoints, TaskLogs } from './logs.js';
import { Timeline } from './timeline.js';
import { TreeView } from './tree.js';
import { byCreated, enc, fmtDateTime, h, stateLabel, throttle } from './util.js';

/** The tab named in the address: `#/executions/<id>?tab=graph`. */
function tabFromHash() {
  const m = location.hash.match(/[?&]tab=([a-z]+)/);
  return m ? m[1] : 'overview';
}

export class ExecutionView {
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
    this.panes = new Map([
      ['overview', h('div', { class: 'split' }, this.tree.el, this.events.el)],
      ['graph', this.dag.el],
      ['timeline', this.timeline.el],
      ['logs', this.logs.el],
      ['checkpoints', this.checkpoints.el],
    ]);
    const labels = { overview: 'Overview', graph: 'Graph', timeline: 'Timeline', logs: 'Logs', checkpoints: 'Checkpoints' };
    this.tabBar = h('nav', { class: 'tabs', id: 'exec-tabs', role: 'tablist' },
      [...this.panes.keys()].map((key) => h('button', {
        type: 'button', role: 'tab', class: 'tab', id: `tab-${key}`, 'data-tab': key,
        onclick: () => this.showTab(key),
      }, labels[key])));
    this.root.replaceChildren(h('div', { class: 'exec-page' },
      this.header.el, this.questions.el, legend, this.tabBar,
      ...[...this.panes].map(([key, el]) => h('div', { class: 'tab-pane', id: `pane-${key}`, role: 'tabpanel' }, el))),
    this.drawer.el);
    this.showTab(tabFromHash());
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
    this.dag.destroy();
  }

  /** Shows one tab's pane; the tab is kept in the address (`?tab=`) so a reload or a link keeps it. */
  showTab(key) {
    const tab = this.panes.has(key) ? key : 'overview';
    for (const [k, el] of this.panes) el.parentElement.hidden = k !== tab;
    for (const button of this.tabBar.children) {
      const on = button.getAttribute('data-tab') === tab;
      button.classList.toggle('active', on);
      button.setAttribute('aria-selected', on ? 'true' : 'false');
    }
    const base = `#/executions/${enc(this.id)}`;
    const hash = tab === 'overview' ? base : `${base}?tab=${tab}`;
    if (location.hash !== hash) history.replaceState(null, '', hash);
    this.tab = tab;
  }

  /** Opens a plan task in the drawer: its newest instance, or what it waits for. */
  openTask(taskId) {
    const inst = this.newestByTask.get(taskId);
    if (inst) this.drawer.open(inst.id);
    else this.drawer.notStarted(taskId);
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
      this.questions.render(Array.isArray(data.questions) ? data.questions : []);
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
    this.questions.noteEvents(events);
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
    // worker lanes, and a state filter's rows, change with any instance's change
    if (this.timeline.mode === 'worker' || this.timeline.filter.state) this.timeline.layoutDirty = true;
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
    this.plan = { name: raw.name, tasks, columns, conflicts: raw.conflicts || [], graph: raw.graph || null };
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
