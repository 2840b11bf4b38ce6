/**
 * Execution page: the header (state, progress, ETA), the controls and the questions card.
 */
import { api, ApiError, controlsHint, controlsUsable, isAbort, refusal } from './api.js';
import { TASK_STATES, TERMINAL_EXEC } from './const.js';
import { enc, fmtDateTime, fmtDuration, fmtPercent, h, progressBar, setBadge, setBar, setText, shortId, span, stateLabel } from './util.js';

/** Execution header: name, state, progress, facts, controls. */
export class ExecHeader {
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
      history: h('a', { id: 'plan-history-link', class: 'back', hidden: true }, 'plan history'),
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
        this.f.name, this.f.state, this.f.live, this.f.history),
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
    if (e.name) {
      const href = `#/plans/${enc(e.name)}`;
      if (f.history.getAttribute('href') !== href) f.history.setAttribute('href', href);
      f.history.hidden = false;
    }
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
export class Controls {
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
export class Questions {
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
      // A question answered (here or elsewhere, as the live events tell) stays with its outcome.
      if (!seen.has(id) && !form.dataset.answered) { form.remove(); this.forms.delete(id); }
    }
    this.updateAccess();
    this.empty.hidden = questions.length > 0;
    this.el.classList.toggle('has-questions', questions.length > 0);
    // No card at all while nothing was asked.
    this.el.hidden = this.forms.size === 0;
    setText(this.count, questions.length ? `${questions.length} waiting for an answer` : '');
  }

  /**
   * Marks questions answered or expired elsewhere (`trellis answer`, another page, a chat
   * button) from the live events, so they stay with the outcome instead of vanishing.
   * `question_answered` details read `<short question id>: <answer>`.
   */
  noteEvents(events) {
    for (const ev of events) {
      if (ev.kind !== 'question_answered' && ev.kind !== 'question_expired') continue;
      const detail = String(ev.detail || '');
      const short = ev.kind === 'question_answered' ? detail.split(': ')[0] : detail;
      for (const [id, form] of this.forms) {
        if (shortId(id) !== short || form.dataset.answered || form._pending) continue;
        const outcome = ev.kind === 'question_answered'
          ? `answered elsewhere: ${detail.slice(short.length + 2)}` : 'expired unanswered';
        form.dataset.answered = outcome;
        this.settle(form, outcome);
      }
    }
  }

  /** A form whose question has its outcome: the outcome shown, nothing left to submit. */
  settle(form, outcome) {
    const ok = form.querySelector('.control-ok');
    setText(ok, outcome);
    ok.hidden = false;
    const input = form.querySelector('[name=answer]');
    if (input) input.disabled = true;
    form.querySelector('button[type=submit]').hidden = true;
    form.querySelector('.answer-error').hidden = true;
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
    const meta = [q.task_id, q.type, q.priority ? `priority ${q.priority}` : null, q.asked_at_ms ? `asked ${fmtDateTime(q.asked_at_ms)}` : null,
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
        this.settle(form, `answered: ${answer}`);
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
