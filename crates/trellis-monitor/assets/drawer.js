/**
 * Execution page: the task drawer, one task instance in full.
 */
import { api, isAbort } from './api.js';
import { TERMINAL_TASK } from './const.js';
import { badge, enc, fmtBytes, fmtClock, fmtDuration, h, setText, shortId } from './util.js';

/**
 * The task drawer: one instance in full — its input and output, every attempt with its error,
 * worker and times, its validation results, its questions with their answers and its log lines
 * (read again every second while it runs). Opened from a DAG node, a grid square, a tree line, a
 * timeline bar or an event row; Escape or × closes it.
 */
export class TaskDrawer {
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
    // The questions of the task's turn with their outcome (the hub keeps every one it replayed).
    const questions = Array.isArray(d.questions) ? d.questions : [];
    const outcome = (q) => (q.outcome === 'answered' ? h('b', { class: 'q-answer' }, `answered: ${q.answer}`)
      : q.outcome === 'expired' ? h('b', { class: 'err' }, 'expired unanswered')
      : q.outcome === 'withdrawn' ? h('b', null, 'withdrawn: the task was cancelled') : h('b', null, 'waiting for an answer'));
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
      questions.length ? h('h4', null, questions.length === 1 ? 'Question' : 'Questions') : null,
      questions.length ? h('ul', { class: 'questions', id: 'drawer-questions' }, questions.map((q) => h('li', null,
        q.text || '(no text)', (q.options || []).length ? h('span', { class: 'muted' }, ` — ${q.options.join(' / ')}`) : null,
        h('div', null, outcome(q))))) : null,
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
export function jsonBlock(value, id) {
  if (value === undefined || value === null) return h('p', { class: 'muted', id }, '—');
  const text = JSON.stringify(value, null, 2);
  const pre = h('pre', { class: 'json', id }, text);
  if (text.split('\n').length <= 40) return pre;
  return h('details', null, h('summary', null, `${text.split('\n').length} lines`), pre);
}
