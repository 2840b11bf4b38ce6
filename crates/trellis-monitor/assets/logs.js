/**
 * Execution page: the checkpoints table and the tasks' log lines.
 */
import { api, banner, isAbort, report, token } from './api.js';
import { enc, fmtBytes, fmtClock, fmtDateTime, h, setText, shortId } from './util.js';

/** Checkpoints table, refreshed every 10 s and after a checkpoint control. */
export class Checkpoints {
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
export const MAX_LOG_LINES = 5000;

/**
 * Task log lines (`ctx.log`, a shell command's stdout and stderr), of every task or one,
 * streamed live (`/logs/live`, Server-Sent Events) as workers publish them. The stream ends by
 * itself once the execution has ended and its last lines arrived; after a break the page
 * reconnects from the lines it has, so none comes twice.
 */
export class TaskLogs {
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
