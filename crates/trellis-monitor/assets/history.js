/**
 * A plan's history (`#/plans/<plan name>`): its recent executions (columns, newest first) by its
 * tasks (rows), each cell coloured by the task's final state in that execution, so a task that
 * fails now and then stands out. A cell opens its execution.
 */
import { api, banner, poll, report } from './api.js';
import { enc, fmtDateTime, h, setText, shortId, stateLabel } from './util.js';

/** Executions the grid shows. */
const LIMIT = 25;

export class PlanHistoryView {
  constructor(root, plan) {
    this.root = root;
    this.plan = plan;
    this.ctl = new AbortController();
    this.shown = '';   // the last answer drawn, to redraw only on change
  }

  mount() {
    this.sub = h('span', { class: 'sub', id: 'history-count' }, 'Loading…');
    this.body = h('div', { class: 'history-wrap', id: 'history-grid' });
    this.root.replaceChildren(h('section', { class: 'card', id: 'plan-history' },
      h('div', { class: 'exec-title' },
        h('a', { class: 'back', href: '#/' }, '← Executions')),
      h('div', { class: 'card-head' },
        h('h2', { id: 'history-plan' }, this.plan), this.sub, h('div', { class: 'grow' }),
        h('span', { class: 'sub' }, 'each cell is a task\'s final state in one execution; click to open it')),
      this.body));
    poll(() => this.refresh(), 5000, this.ctl.signal);
  }

  unmount() {
    this.ctl.abort();
  }

  async refresh() {
    try {
      const data = await api(`/api/plans/${enc(this.plan)}/history?limit=${LIMIT}`, { signal: this.ctl.signal });
      banner.clear('history');
      const text = JSON.stringify(data);
      if (text === this.shown) return;
      this.shown = text;
      this.render(data);
    } catch (err) {
      report('history', err);
    }
  }

  render(data) {
    const executions = Array.isArray(data.executions) ? data.executions : [];
    const tasks = Array.isArray(data.tasks) ? data.tasks : [];
    const cells = data.cells && typeof data.cells === 'object' ? data.cells : {};
    setText(this.sub, executions.length === 0 ? ''
      : `${executions.length} most recent execution${executions.length === 1 ? '' : 's'}, newest first`);
    if (executions.length === 0) {
      this.body.replaceChildren(h('div', { class: 'empty' },
        `No executions of plan “${this.plan}” to show (plan names are matched exactly).`));
      return;
    }
    const open = (e) => `#/executions/${enc(e.id)}`;
    const head = h('tr', null, h('th', { class: 'task' }, 'Task'),
      executions.map((e) => h('th', { class: 'col' },
        h('a', {
          class: 'cell exec-cell', href: open(e), 'data-state': e.state, 'data-execution-id': e.id,
          title: `${shortId(e.id)} · ${fmtDateTime(e.created_ms)} · run ${e.run_number} · ${stateLabel(e.state)}`,
        }))));
    const rows = tasks.map((task) => {
      const states = Array.isArray(cells[task]) ? cells[task] : [];
      return h('tr', { 'data-task-id': task },
        h('th', { class: 'task', title: task }, task),
        executions.map((e, i) => {
          const state = states[i];
          const title = `${task} in ${shortId(e.id)} (${fmtDateTime(e.created_ms)}): ${state ? stateLabel(state) : 'no instance'}`;
          return h('td', null, state
            ? h('a', { class: 'cell', href: open(e), 'data-state': state, 'data-execution-id': e.id, title })
            : h('a', { class: 'cell none', href: open(e), 'data-execution-id': e.id, title }));
        }));
    });
    const table = h('table', { class: 'history', id: 'history-table' }, h('thead', null, head), h('tbody', null, rows));
    if (tasks.length === 0) {
      this.body.replaceChildren(table, h('div', { class: 'empty' }, 'No task instances recorded yet.'));
    } else {
      this.body.replaceChildren(table);
    }
  }
}
