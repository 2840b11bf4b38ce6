/**
 * The executions list (`#/`): newest first, a page at a time, filtered by state and by a part of
 * the plan name (any case). The plan name opens the plan's history grid.
 */
import { api, banner, poll, report } from './api.js';
import { EXEC_STATES } from './const.js';
import { badge, enc, fmtDateTime, fmtDuration, fmtPercent, h, progressBar, setBadge, setBar, setText, shortId, span, throttle } from './util.js';

/** Filters survive navigation between pages, and so does the page: `pages` holds the token of
 * every page up to the shown one (the first page's is empty). */
export const listFilters = { state: '', name: '', pages: [''] };

/** Executions one page shows. */
const PAGE_SIZE = 50;

export class ExecutionsView {
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
      id: 'filter-name', type: 'search', placeholder: 'filter by name (any case)', 'aria-label': 'filter by name',
      value: listFilters.name,
    });
    const refreshSoon = throttle(() => this.refresh(), 250);
    // Other filters, other pages: start again from the first.
    stateSelect.addEventListener('change', () => {
      listFilters.state = stateSelect.value;
      listFilters.pages = [''];
      this.refresh();
    });
    nameInput.addEventListener('input', () => {
      listFilters.name = nameInput.value;
      listFilters.pages = [''];
      refreshSoon();
    });

    this.tbody = h('tbody');
    this.emptyRow = h('tr', { class: 'empty-row' }, h('td', { colspan: 7, class: 'empty' }, 'Loading…'));
    this.tbody.append(this.emptyRow);
    this.count = h('span', { class: 'sub' });
    this.root.replaceChildren(h('section', { class: 'card', id: 'executions' },
      h('div', { class: 'card-head' },
        h('h2', null, 'Executions'), this.count, h('div', { class: 'grow' }),
        h('div', { class: 'filters' }, stateSelect, nameInput)),
      h('table', { class: 'grid', id: 'executions-table' },
        h('thead', null, h('tr', null,
          h('th', null, 'State'), h('th', null, 'Name'),
          h('th', { class: 'right', title: 'the execution\'s current run: a retry starts the next' }, 'Run'),
          h('th', null, 'Progress'),
          h('th', { class: 'right' }, 'Done'), h('th', { class: 'right' }, 'Duration'),
          h('th', { class: 'right' }, 'Created'))),
        this.tbody),
      this.pager()));

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

  /** "Newer" and "Older" buttons under the table, and which page this is. */
  pager() {
    this.prev = h('button', { id: 'page-prev', type: 'button' }, '← Newer');
    this.next = h('button', { id: 'page-next', type: 'button' }, 'Older →');
    this.pageNo = h('span', { id: 'page-number', class: 'sub' });
    this.prev.addEventListener('click', () => {
      if (listFilters.pages.length > 1) listFilters.pages.pop();
      this.refresh();
    });
    this.next.addEventListener('click', () => {
      if (!this.nextToken) return;
      listFilters.pages.push(this.nextToken);
      this.refresh();
    });
    this.nextToken = null;
    this.pagerEl = h('div', { class: 'pager', id: 'executions-pager', hidden: true }, this.prev, this.pageNo, this.next);
    return this.pagerEl;
  }

  async refresh() {
    const params = new URLSearchParams();
    if (listFilters.state) params.append('state', listFilters.state);
    if (listFilters.name.trim()) params.set('name', listFilters.name.trim());
    params.set('page_size', String(PAGE_SIZE));
    const pageToken = listFilters.pages[listFilters.pages.length - 1];
    if (pageToken) params.set('page_token', pageToken);
    const request = ++this.request;
    try {
      const data = await api(`/api/executions?${params}`, { signal: this.ctl.signal });
      if (request !== this.request) return;
      banner.clear('list');
      this.nextToken = data.next_page_token || null;
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
    const page = listFilters.pages.length;
    setText(this.count, `${list.length} shown`);
    // One page only: no pager.
    this.pagerEl.hidden = page <= 1 && !this.nextToken;
    setText(this.pageNo, `page ${page}`);
    this.prev.disabled = page <= 1;
    this.next.disabled = !this.nextToken;
  }

  createRow(id) {
    const bar = progressBar();
    const cells = {
      state: badge('pending'),
      question: h('span', { class: 'qbadge', hidden: true }),
      link: h('a', { class: 'plan-link', title: 'this plan\'s history' }),
      id: h('a', { class: 'mono exec-link', href: `#/executions/${enc(id)}` }, shortId(id)),
      run: h('td', { class: 'right num run' }),
      fill: bar.fill,
      pct: h('span', { class: 'pct' }),
      done: h('td', { class: 'right num' }),
      duration: h('td', { class: 'right num' }),
      created: h('td', { class: 'right num muted' }),
    };
    const tr = h('tr', { class: 'clickable', 'data-execution-id': id },
      h('td', null, cells.state, cells.question),
      h('td', { class: 'cell-name' }, cells.link, cells.id),
      cells.run,
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
    const planHref = `#/plans/${enc(exec.name || '')}`;
    if (cells.link.getAttribute('href') !== planHref) cells.link.setAttribute('href', planHref);
    setText(cells.run, exec.run_number ?? '—');
    // Someone must answer: the state says so, or a question is open while the execution runs on.
    const asks = Number(exec.open_questions) || 0;
    const waiting = asks > 0 || exec.state === 'waiting_for_human';
    cells.question.hidden = !waiting;
    setText(cells.question, asks > 1 ? `${asks} questions` : 'question');
    cells.question.title = waiting ? 'waiting for an answer: open the execution to answer' : '';
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
