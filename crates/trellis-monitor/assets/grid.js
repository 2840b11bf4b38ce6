/**
 * Execution page: a grid of plan tasks, one square per task coloured by its state — a wave of a
 * big plan or the members of a fan-out, opened from the DAG. Filters by state and by id, and a
 * square opens its task in the drawer. Patched in place as states change.
 */
import { STACK_ORDER } from './const.js';
import { h, setText, stateLabel } from './util.js';

export class TaskGrid {
  constructor(view) {
    this.view = view;
    this.ids = [];
    this.cells = new Map();   // task id -> cell element
    this.title = h('h4', { class: 'grid-title' });
    this.counts = h('span', { class: 'sub grid-counts' });
    this.stateFilter = h('select', { id: 'grid-state-filter', 'aria-label': 'show tasks in state', onchange: () => this.applyFilter() },
      h('option', { value: '' }, 'every state'));
    this.nameFilter = h('input', {
      id: 'grid-name-filter', type: 'search', placeholder: 'task id contains…', 'aria-label': 'task id contains',
      oninput: () => this.applyFilter(),
    });
    this.body = h('div', { class: 'grid-cells', id: 'grid-cells' });
    this.body.addEventListener('click', (ev) => {
      const cell = ev.target.closest('.grid-cell');
      if (cell) this.view.openTask(cell.getAttribute('data-task-id'));
    });
    this.el = h('div', { class: 'task-grid', id: 'task-grid', hidden: true },
      h('div', { class: 'grid-head' }, this.title, this.counts, h('div', { class: 'grow' }),
        this.stateFilter, this.nameFilter,
        h('button', { type: 'button', class: 'grid-close', title: 'close the grid', onclick: () => this.close() }, '×')),
      this.body);
  }

  /** Shows these tasks (plan task ids) under `title`. */
  open(title, ids) {
    this.ids = ids;
    setText(this.title, title);
    this.cells.clear();
    const cells = ids.map((id) => {
      const state = this.view.taskState.get(id) || 'pending';
      const cell = h('button', { type: 'button', class: 'grid-cell', 'data-task-id': id, 'data-state': state, title: `${id} · ${stateLabel(state)}` });
      this.cells.set(id, cell);
      return cell;
    });
    this.body.replaceChildren(...cells);
    this.stateFilter.value = '';
    this.nameFilter.value = '';
    this.el.hidden = false;
    this.refreshCounts();
    this.el.scrollIntoView({ block: 'nearest' });
  }

  close() {
    this.el.hidden = true;
    this.ids = [];
    this.cells.clear();
    this.body.replaceChildren();
  }

  /** Re-colours the cells of tasks whose state changed. */
  patch(taskIds) {
    if (this.el.hidden) return;
    let any = false;
    for (const id of taskIds) {
      const cell = this.cells.get(id);
      if (!cell) continue;
      const state = this.view.taskState.get(id) || 'pending';
      if (cell.getAttribute('data-state') === state) continue;
      cell.setAttribute('data-state', state);
      cell.title = `${id} · ${stateLabel(state)}`;
      any = true;
    }
    if (any) {
      this.refreshCounts();
      if (this.stateFilter.value) this.applyFilter();
    }
  }

  refreshCounts() {
    const counts = {};
    for (const cell of this.cells.values()) {
      const s = cell.getAttribute('data-state');
      counts[s] = (counts[s] || 0) + 1;
    }
    const present = STACK_ORDER.filter((s) => counts[s]);
    setText(this.counts, `${this.ids.length.toLocaleString('en-US')} tasks: ` +
      present.map((s) => `${counts[s].toLocaleString('en-US')} ${stateLabel(s)}`).join(', '));
    const chosen = this.stateFilter.value;
    const options = [h('option', { value: '' }, 'every state'),
      ...present.map((s) => h('option', { value: s }, `${stateLabel(s)} (${counts[s]})`))];
    if (chosen && !counts[chosen]) options.push(h('option', { value: chosen }, `${stateLabel(chosen)} (0)`));
    this.stateFilter.replaceChildren(...options);
    this.stateFilter.value = chosen;
  }

  applyFilter() {
    const state = this.stateFilter.value;
    const text = this.nameFilter.value.trim().toLowerCase();
    for (const [id, cell] of this.cells) {
      const shown = (!state || cell.getAttribute('data-state') === state) && (!text || id.toLowerCase().includes(text));
      cell.hidden = !shown;
    }
  }
}
