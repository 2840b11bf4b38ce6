/**
 * Execution page: the event log.
 */
import { api, banner, report } from './api.js';
import { EVENT_CAP, EVENT_CATEGORY, EVENT_PAGE } from './const.js';
import { enc, fmtClock, h, setText, shortId } from './util.js';

/**
 * The event log. Holds a window of at most EVENT_CAP rows. In live mode new events are appended
 * and the oldest rows dropped; "load older" pages backwards with `from`, and once that pushes the
 * window past the cap the newest rows are dropped and live events are only counted until the user
 * returns to the latest ones.
 */
export class EventLog {
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
    // A task id fragment: rows about other tasks (and about no task) are hidden.
    this.nameFilter = h('input', {
      id: 'events-name-filter', type: 'search', placeholder: 'task id contains…', 'aria-label': 'events of tasks whose id contains',
      oninput: () => this.applyNameFilter(),
    });
    this.el = h('section', { class: 'card', id: 'event-log' },
      h('div', { class: 'card-head' }, h('h3', null, 'Event log'), this.info, h('div', { class: 'grow' }),
        this.nameFilter, h('label', { class: 'sub' }, this.failuresOnly, ' failures only')),
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
    this.applyNameFilter();
  }

  /** Whether a row passes the task id filter. */
  matchesName(row) {
    const text = this.nameFilter.value.trim().toLowerCase();
    if (!text) return true;
    const cell = row.querySelector('.inst');
    return !!cell && cell.textContent.toLowerCase().includes(text);
  }

  applyNameFilter() {
    for (const row of this.list.querySelectorAll('.event')) row.classList.toggle('name-out', !this.matchesName(row));
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
    if (!this.matchesName(row)) row.classList.add('name-out');
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
