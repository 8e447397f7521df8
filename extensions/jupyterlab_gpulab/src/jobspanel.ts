// The Jobs plugin: "Run as job…" (command palette, the file browser's and the open document's
// context menus, and the Jobs panel's own button) submits the open script (`python FILE`) or
// notebook (`jupyter execute FILE`) from its folder as a training job, with the GPU type, cards,
// nodes and spot bid chosen in a dialog; the Jobs panel (left sidebar) lists the user's jobs
// with their state, why they wait, attempts and exit code, cancels one, and follows a job's log
// as it is printed. Everything goes through this server's extension (gpulab/api/jobs...), which
// asks the hub with this server's own token: a job runs on its own servers, so it outlives this
// one and this page.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { LabIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ApiError, getPool, request } from './api';
import {
  attemptsText,
  IJob,
  IJobChoices,
  ILogChunk,
  isTerminal,
  jobCommandFor,
  jobOn,
  LogFollower,
  stateText,
  submitBody
} from './jobs';
import { IPool } from './logic';
import { IGpulabSession } from './tokens';
import { el } from './widgets';

export const RUN_AS_JOB = 'gpulab:run-as-job';
export const OPEN_JOBS = 'gpulab:open-jobs';
const LIST_POLL_MS = 5000;
const LOG_POLL_MS = 2000;

export const jobsIcon = new LabIcon({
  name: 'gpulab:jobs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M4 4h16v4H4zM4 10h16v4H4zM4 16h10v4H4z"/><path d="M17 15l5 3-5 3z"/></g></svg>'
});

const listJobs = () => request<{ jobs: IJob[] }>('jobs');
const getJob = (id: number) => request<IJob>(`jobs/${id}`);
const postJob = (body: object) =>
  request<IJob>('jobs', { method: 'POST', body: JSON.stringify(body) });
const cancelJob = (id: number) => request<IJob>(`jobs/${id}`, { method: 'DELETE' });
const readLog = (id: number, offset: number) =>
  request<ILogChunk>(`jobs/${id}/log?offset=${offset}`);

/** The body of the "Run as job" dialog: the command and where, GPU type, cards, nodes, spot. */
export class JobForm extends Widget {
  readonly command = el('input', 'jp-mod-styled jp-gpulab-job-command');
  readonly gpu = el('select', 'jp-mod-styled jp-gpulab-job-gpu');
  readonly gpus = el('input', 'jp-mod-styled jp-gpulab-job-gpus');
  readonly nodes = el('input', 'jp-mod-styled jp-gpulab-job-nodes');
  readonly spot = el('input', 'jp-gpulab-job-spot');
  readonly bid = el('input', 'jp-mod-styled jp-gpulab-job-bid');
  readonly name = el('input', 'jp-mod-styled jp-gpulab-job-name');

  constructor(
    command: string,
    private cwd: string,
    pool: IPool | null,
    current: string
  ) {
    super();
    this.addClass('jp-gpulab-job-form');
    this.command.value = command;
    this.command.spellcheck = false;
    for (const t of pool?.gpu_types || []) {
      if (t.total > 0) {
        const option = el('option', '', `${t.display_name} (${t.free} of ${t.total} free)`);
        option.value = t.slug;
        this.gpu.appendChild(option);
      }
    }
    const none = el('option', '', 'No GPU');
    none.value = 'none';
    this.gpu.appendChild(none);
    const values = Array.from(this.gpu.options).map(o => o.value);
    this.gpu.value = values.includes(current) ? current : values[0];
    this.gpus.value = '1';
    this.gpus.inputMode = 'numeric';
    this.nodes.value = '1';
    this.nodes.inputMode = 'numeric';
    this.spot.type = 'checkbox';
    this.bid.placeholder = 'on-demand price';
    this.bid.inputMode = 'decimal';
    this.name.placeholder = 'optional';
    this.name.maxLength = 64;
    const where = el(
      'div',
      'jp-gpulab-note jp-gpulab-job-wide',
      cwd ? `Runs in ~/${cwd}, with no server or browser open.` : 'Runs in your home.'
    );
    const row = (label: string, input: HTMLElement, wide = false) => {
      const l = el('label', `jp-gpulab-job-field${wide ? ' jp-gpulab-job-wide' : ''}`, label);
      l.appendChild(input);
      return l;
    };
    const spotLabel = el('label', 'jp-gpulab-job-field jp-gpulab-job-spot-label');
    spotLabel.append(this.spot, el('span', '', 'Spot (cheaper; resumed if preempted)'));
    this.node.append(
      row('Command', this.command, true),
      where,
      row('GPU type', this.gpu),
      row('Cards per node', this.gpus),
      row('Nodes', this.nodes),
      spotLabel,
      row('Bid per card-hour', this.bid),
      row('Name', this.name)
    );
    const sync = () => {
      const noGpu = this.gpu.value === 'none';
      this.gpus.disabled = noGpu;
      this.nodes.disabled = noGpu;
      this.spot.disabled = noGpu;
      if (noGpu) {
        this.spot.checked = false;
      }
      this.bid.disabled = !this.spot.checked;
    };
    this.gpu.addEventListener('change', sync);
    this.spot.addEventListener('change', sync);
    sync();
  }

  getValue(): IJobChoices {
    return {
      command: this.command.value,
      cwd: this.cwd,
      name: this.name.value,
      gpu: this.gpu.value,
      gpus: this.gpus.value,
      nodes: this.nodes.value,
      spot: this.spot.checked,
      bid: this.bid.value
    };
  }
}

export interface IJobsPanelActions {
  runOpenFile(): void;
  typeName(slug: string): string;
}

/** Left sidebar: the user's jobs, and the log of the one being followed. */
export class JobsPanel extends Widget {
  private list = el('div', 'jp-gpulab-jobs');
  private answer = el('p', 'jp-gpulab-note jp-gpulab-jobs-answer');
  private logBox = el('div', 'jp-gpulab-job-logbox');
  private logTitle = el('div', 'jp-gpulab-job-log-title');
  private logText = el('pre', 'jp-gpulab-job-log');
  private logState = el('div', 'jp-gpulab-note jp-gpulab-job-log-state');
  private timer: number | undefined;
  private failures = 0;
  private following: { id: number; follower: LogFollower; timer?: number } | null = null;
  jobs: IJob[] = [];

  constructor(private actions: IJobsPanelActions) {
    super();
    this.id = 'gpulab-jobs';
    this.addClass('jp-gpulab-panel');
    this.title.icon = jobsIcon;
    this.title.caption = 'Training jobs';
    const run = el(
      'button',
      'jp-mod-styled jp-mod-accept jp-gpulab-jobs-run',
      'Run the open file as a job…'
    );
    run.type = 'button';
    run.addEventListener('click', () => this.actions.runOpenFile());
    const close = el('button', 'jp-mod-styled jp-gpulab-job-log-close', 'Close');
    close.type = 'button';
    close.addEventListener('click', () => this.unfollow());
    const head = el('div', 'jp-gpulab-job-log-head');
    head.append(this.logTitle, close);
    this.logBox.append(head, this.logText, this.logState);
    this.logBox.hidden = true;
    this.node.append(
      el('h2', 'jp-gpulab-panel-title', 'Jobs'),
      run,
      this.answer,
      this.list,
      this.logBox,
      el(
        'p',
        'jp-gpulab-note',
        'A job runs on its own GPUs, with no server or browser open, and is billed per second. ' +
          'A spot job that is preempted is queued again and resumes from its last checkpoint ' +
          '($GPULAB_RESUME).'
      )
    );
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.refresh();
  }

  protected onBeforeHide(msg: Message): void {
    super.onBeforeHide(msg);
    window.clearTimeout(this.timer);
  }

  say(text: string, ok: boolean): void {
    this.answer.textContent = text;
    this.answer.dataset.ok = ok ? 'yes' : 'no';
    this.answer.classList.toggle('jp-gpulab-error', !ok);
  }

  async refresh(): Promise<void> {
    window.clearTimeout(this.timer);
    try {
      const answer = await listJobs();
      this.jobs = [...(answer.jobs || [])].sort((a, b) => b.id - a.id);
      this.render();
      this.failures = 0;
    } catch (e) {
      // This server did not answer (it stopped, or restarts): the jobs run on regardless; ask
      // again less and less often rather than every few seconds.
      this.failures += 1;
      const message = `Jobs unavailable: ${(e as Error).message}`;
      this.list.replaceChildren(el('p', 'jp-gpulab-note', message));
    }
    if (this.isVisible) {
      const delay = LIST_POLL_MS * 2 ** Math.min(this.failures, 6);
      this.timer = window.setTimeout(() => void this.refresh(), delay);
    }
  }

  render(): void {
    if (!this.jobs.length) {
      this.list.replaceChildren(el('p', 'jp-gpulab-note jp-gpulab-jobs-empty', 'No jobs yet.'));
      return;
    }
    this.list.replaceChildren(...this.jobs.map(job => this.row(job)));
  }

  private row(job: IJob): HTMLElement {
    const node = el('div', 'jp-gpulab-job');
    node.dataset.job = String(job.id);
    node.dataset.state = job.state;
    const head = el('div', 'jp-gpulab-job-head');
    head.append(
      el('span', 'jp-gpulab-job-title', `Job ${job.id}${job.name ? ` · ${job.name}` : ''}`),
      el('span', `jp-gpulab-badge jp-gpulab-job-state jp-gpulab-job-${job.state}`, stateText(job))
    );
    node.append(
      head,
      el('code', 'jp-gpulab-job-cmd', job.command),
      el('div', 'jp-gpulab-note', jobOn(job, this.actions.typeName))
    );
    if (job.reason && job.reason !== job.state) {
      // Why it waits or how it ended (a reason that only repeats the state is left out).
      node.appendChild(el('div', 'jp-gpulab-job-reason', job.reason));
    }
    const tries = attemptsText(job);
    if (tries) {
      node.appendChild(el('div', 'jp-gpulab-note jp-gpulab-job-attempts', tries));
    }
    const buttons = el('div', 'jp-gpulab-job-actions');
    const log = el(
      'button',
      'jp-mod-styled jp-gpulab-job-follow',
      isTerminal(job.state) ? 'Log' : 'Follow log'
    );
    log.type = 'button';
    log.addEventListener('click', () => this.follow(job));
    buttons.appendChild(log);
    if (!isTerminal(job.state)) {
      const cancel = el('button', 'jp-mod-styled jp-mod-warn jp-gpulab-job-cancel', 'Cancel');
      cancel.type = 'button';
      cancel.disabled = !!job.cancel_requested;
      cancel.addEventListener('click', () => void this.cancel(job, cancel));
      buttons.appendChild(cancel);
    }
    node.appendChild(buttons);
    return node;
  }

  private async cancel(job: IJob, button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    try {
      await cancelJob(job.id);
      this.say(`Job ${job.id} is being cancelled: its servers stop and its cards are freed.`, true);
    } catch (e) {
      this.say((e as Error).message, false);
    }
    void this.refresh();
  }

  follow(job: IJob): void {
    this.unfollow();
    const id = job.id;
    const follower = new LogFollower(
      offset => readLog(id, offset),
      async () => isTerminal((await getJob(id)).state)
    );
    const f: { id: number; follower: LogFollower; timer?: number } = { id, follower };
    this.following = f;
    this.logBox.hidden = false;
    this.logBox.dataset.job = String(id);
    this.logTitle.textContent = `Log of job ${id}`;
    this.logText.textContent = '';
    this.logState.textContent = 'Reading…';
    const tick = async () => {
      if (this.following !== f) {
        return;
      }
      let more = false;
      try {
        const step = await follower.step();
        more = step.more;
        if (this.following !== f) {
          return;
        }
        if (step.text) {
          const box = this.logText;
          const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
          box.append(step.text);
          if (atEnd) {
            box.scrollTop = box.scrollHeight;
          }
        }
      } catch (e) {
        if (e instanceof ApiError && e.status === 404) {
          this.logState.textContent = e.message;
          return;
        }
        if (!(e instanceof ApiError && e.answered)) {
          // This server is gone (stopped, restarting): the job is not; its log can be followed
          // again from the list once the server answers.
          this.logBox.dataset.done = 'paused';
          this.logState.textContent =
            'This server does not answer: the job runs on without it. Follow its log again ' +
            'once JupyterLab is back.';
          return;
        }
        const message = (e as Error).message;
        this.logState.textContent = `The hub did not answer; trying again… (${message})`;
      }
      if (follower.done) {
        this.logBox.dataset.done = 'yes';
        this.logState.textContent = 'The job has ended: this is all of its output.';
        if (!this.logText.textContent) {
          this.logText.textContent = '(no output)';
        }
        return;
      }
      this.logState.textContent = 'Following: new output appears as the job prints it.';
      f.timer = window.setTimeout(() => void tick(), more ? 200 : LOG_POLL_MS);
    };
    this.logBox.dataset.done = 'no';
    void tick();
  }

  unfollow(): void {
    if (this.following?.timer) {
      window.clearTimeout(this.following.timer);
    }
    this.following = null;
    this.logBox.hidden = true;
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    this.unfollow();
    super.dispose();
  }
}

/** The path of the file a command was asked for: the file browser's selection (its context
 * menu), else the document in the main area. */
function targetPath(
  app: JupyterFrontEnd,
  fileBrowser: IDefaultFileBrowser | null,
  fromBrowser: boolean
): string {
  if (fromBrowser && fileBrowser) {
    const item = fileBrowser.selectedItems().next();
    if (item && !item.done && item.value) {
      return item.value.path;
    }
  }
  const widget = app.shell.currentWidget as unknown as { context?: { path?: string } } | null;
  return widget?.context?.path || '';
}

async function runAsJob(
  app: JupyterFrontEnd,
  session: IGpulabSession,
  panel: JobsPanel,
  path: string
): Promise<void> {
  const job = jobCommandFor(path);
  if (!job) {
    await showDialog({
      title: 'Run as job',
      body: path
        ? `${path} is not a Python script (.py) or a notebook (.ipynb).`
        : 'Open a Python script (.py) or a notebook (.ipynb) first.',
      buttons: [Dialog.okButton()]
    });
    return;
  }
  await app.commands.execute('docmanager:save-all').catch(() => undefined);
  let pool: IPool | null = null;
  try {
    pool = await getPool();
  } catch {
    pool = null; // the type list falls back to "No GPU"; the hub still checks the choice
  }
  const current = session.status.gpu_type;
  let form = new JobForm(job.command, job.cwd, pool, current);
  for (;;) {
    const answer = await showDialog({
      title: `Run ${path.split('/').pop()} as a job`,
      body: form,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Submit job' })]
    });
    if (!answer.button.accept || !answer.value) {
      return;
    }
    const choices = answer.value;
    try {
      const submitted = await postJob(submitBody(choices));
      app.shell.activateById(panel.id);
      panel.say(`Job ${submitted.id} submitted: ${submitted.reason || submitted.state}.`, true);
      await panel.refresh();
      panel.follow(submitted);
      return;
    } catch (e) {
      // The hub's answer names the field and what is allowed: show it with the choices kept.
      const message = (e as Error).message;
      const again = await showDialog({
        title: 'The job was not submitted',
        body: message,
        buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Change it' })]
      });
      if (!again.button.accept) {
        return;
      }
      const kept = new JobForm(choices.command, job.cwd, pool, choices.gpu);
      kept.gpus.value = choices.gpus;
      kept.nodes.value = choices.nodes;
      kept.spot.checked = choices.spot;
      kept.bid.value = choices.bid;
      kept.bid.disabled = !choices.spot;
      kept.name.value = choices.name;
      form = kept;
    }
  }
}

export const jobsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:jobs',
  description:
    'gpulab: run the open script or notebook as a training job (GPU type, cards, spot), and ' +
    'the Jobs panel: your jobs, cancel, and a log that follows the output',
  autoStart: true,
  requires: [IGpulabSession],
  optional: [ICommandPalette, IDefaultFileBrowser],
  activate: (
    app: JupyterFrontEnd,
    session: IGpulabSession | null,
    palette: ICommandPalette | null,
    fileBrowser: IDefaultFileBrowser | null
  ): void => {
    if (!session) {
      return;
    }
    const typeName = (slug: string) => session.catalog?.gpu_types[slug]?.display_name || slug;
    const panel = new JobsPanel({
      runOpenFile: () => void app.commands.execute(RUN_AS_JOB),
      typeName
    });
    app.shell.add(panel, 'left', { rank: 720 });
    app.commands.addCommand(RUN_AS_JOB, {
      label: args => (args.fromBrowser ? 'Run as Job…' : 'Run as job…'),
      caption:
        'Run this script (python FILE) or notebook (jupyter execute FILE) as a training job ' +
        'on GPUs you choose; it keeps running without this server or page',
      icon: jobsIcon,
      execute: args =>
        runAsJob(app, session, panel, targetPath(app, fileBrowser, !!args.fromBrowser))
    });
    app.commands.addCommand(OPEN_JOBS, {
      label: 'Show my training jobs',
      execute: () => app.shell.activateById(panel.id)
    });
    if (palette) {
      palette.addItem({ command: RUN_AS_JOB, category: 'gpulab' });
      palette.addItem({ command: OPEN_JOBS, category: 'gpulab' });
    }
    for (const selector of [
      '.jp-DirListing-item[data-file-type="python"]',
      '.jp-DirListing-item[data-file-type="notebook"]'
    ]) {
      const args = { fromBrowser: true };
      app.contextMenu.addItem({ command: RUN_AS_JOB, selector, rank: 3, args });
    }
    for (const selector of ['.jp-Notebook', '.jp-FileEditor']) {
      app.contextMenu.addItem({ command: RUN_AS_JOB, selector, rank: 100 });
    }
  }
};
